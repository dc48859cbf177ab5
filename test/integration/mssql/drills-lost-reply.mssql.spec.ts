/**
 * The lost reply failure drills of test/integration/drills on SQL Server (review 2026-12-01, S6),
 * against both databases: real worker processes, the same drill code as on PostgreSQL. The
 * worker reaches SQL Server through a TdsProxy (test/helpers/tds-proxy.ts), which reads the
 * packets and so connects with encrypt=false: the server must not force encryption.
 */
import { lostReplyDrills } from '../drills/lost-reply.drills.js';
import { describeEachMssqlDatabase } from './mssql-databases.js';
import { mssqlDrillTarget } from './mssql-drill-target.js';

describeEachMssqlDatabase('failure drills: lost reply', (db) => lostReplyDrills(mssqlDrillTarget(db)));
