/**
 * The crash failure drills of test/integration/drills on SQL Server (review 2026-12-01, S6),
 * against both databases: real worker processes, the same drill code as on PostgreSQL.
 */
import { crashDrills } from '../drills/crash.drills.js';
import { describeEachMssqlDatabase } from './mssql-databases.js';
import { mssqlDrillTarget } from './mssql-drill-target.js';

describeEachMssqlDatabase('failure drills: crash', (db) => crashDrills(mssqlDrillTarget(db)));
