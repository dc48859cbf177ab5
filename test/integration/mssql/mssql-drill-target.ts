import sql from 'mssql';
import { createMssqlStore } from '../../../lib/src/store/mssql/mssql.connect.js';
import { mssqlQueries } from '../../../lib/src/store/mssql/mssql.queries.js';
import type { EffectsReport } from '../../helpers/drills.js';
import { dropMssqlSchema, mssqlRows, withMssqlPool } from '../../helpers/mssql.js';
import {
  CLOCK_PAST,
  createEffectTables,
  drillJobRow,
  effectOfKey,
  effectsReport,
  effectWritesOfKey,
  runsOfJob,
} from '../../helpers/mssql-test-queries.js';
import { TdsProxy } from '../../helpers/tds-proxy.js';
import type { DrillTarget } from '../drills/harness.js';
import type { MssqlDatabase } from './mssql-databases.js';

/** The failure drills (test/integration/drills) on one SQL Server database. */
export function mssqlDrillTarget(db: MssqlDatabase): DrillTarget {
  const byKey = (key: string) => (r: sql.Request) => r.input('key', sql.NVarChar(255), key);
  return {
    dialect: 'mssql',
    url: db.url,
    openStore: (schema) => createMssqlStore({ url: db.url, poolSize: 2 }, { schema }),
    async createEffectTables(schema) {
      await withMssqlPool(db.url, (pool) => pool.request().batch(createEffectTables(schema)));
    },
    dropSchema: (schema) => dropMssqlSchema(db.url, schema),
    async jobRow(schema, id) {
      const [row] = await mssqlRows<Record<string, unknown>>(db.url, drillJobRow(schema), (r) =>
        r.input('id', sql.BigInt, id),
      );
      return row!;
    },
    runsOf: (schema, id) => mssqlRows(db.url, runsOfJob(schema), (r) => r.input('jobId', sql.BigInt, id)),
    effectWritesOf: (schema, key) => mssqlRows(db.url, effectWritesOfKey(schema), byKey(key)),
    effectsOf: (schema, key) => mssqlRows(db.url, effectOfKey(schema), byKey(key)),
    async effectsReport(schema): Promise<EffectsReport> {
      const result = await withMssqlPool(db.url, (pool) => pool.request().query(effectsReport(schema)));
      const sets = result.recordsets as unknown as Record<string, unknown>[][];
      const [totals, notDone, missing, duplicates, stray, reruns] = sets as [
        { jobs: number; done: number; effects: number; runs: number; refused: number }[],
        { id: string; state: string; key: string | null }[],
        { key: string }[],
        { key: string }[],
        { n: number }[],
        { n: number }[],
      ];
      return {
        jobs: totals[0]!.jobs,
        done: totals[0]!.done,
        notDone,
        effects: totals[0]!.effects,
        missingEffects: missing.map((r) => r.key),
        duplicateEffects: duplicates.map((r) => r.key),
        strayEffects: stray[0]!.n,
        runs: totals[0]!.runs,
        jobsRunMoreThanOnce: reruns[0]!.n,
        refusedRepeats: totals[0]!.refused,
      };
    },
    async clockPast(since, ms) {
      const [row] = await mssqlRows<{ Past: boolean }>(db.url, CLOCK_PAST, (r) =>
        r.input('since', sql.DateTime2(3), since).input('ms', sql.Int, ms),
      );
      return row!.Past;
    },
    async startWire(schema) {
      // The store sends each statement as the exact text mssqlQueries() builds.
      const { claim, heartbeat, complete } = mssqlQueries(schema);
      const proxy = await TdsProxy.start(db.url, { claim, heartbeat, complete });
      return {
        url: proxy.urlFor(db.url),
        count: (statement, from) => proxy.count(statement, from),
        holdReplyAfter: (statement) => proxy.holdReplyAfter(statement),
        close: () => proxy.close(),
      };
    },
  };
}
