import { createPostgresStore } from '../../../lib/src/store/postgres/postgres.connect.js';
import { dropPgSchema, PG_URL, sql } from '../../helpers/databases.js';
import { effectsReport } from '../../helpers/drills.js';
import { PgProxy } from '../../helpers/pg-proxy.js';
import { createEffectTables } from '../../helpers/worker-process.js';
import type { DrillTarget } from './harness.js';

/** The drills on the shared PostgreSQL (`npm test`). */
export const postgresDrillTarget: DrillTarget = {
  dialect: 'postgres',
  url: PG_URL,
  openStore: (schema) => createPostgresStore({ url: PG_URL, poolSize: 2 }, { schema }),
  createEffectTables: (schema) => createEffectTables(PG_URL, schema),
  dropSchema: (schema) => dropPgSchema(schema),
  async jobRow(schema, id) {
    const [found] = await sql(
      PG_URL,
      `SELECT state, attempts, claim_token::text AS claim_token, lease_until, worker_id, claimed_at, finished_at, last_error
       FROM "${schema}".jobs WHERE id = $1`,
      [id],
    );
    return found!;
  },
  runsOf: (schema, id) =>
    sql<{ pid: number; attempt: number }>(
      PG_URL,
      `SELECT pid, attempt FROM "${schema}".runs WHERE job_id = $1 ORDER BY at`,
      [id],
    ),
  effectWritesOf: (schema, key) =>
    sql<{ pid: number; applied: boolean }>(
      PG_URL,
      `SELECT pid, applied FROM "${schema}".effect_writes WHERE idempotency_key = $1 ORDER BY at`,
      [key],
    ),
  effectsOf: (schema, key) =>
    sql<{ pid: number }>(PG_URL, `SELECT pid FROM "${schema}".effects WHERE idempotency_key = $1`, [key]),
  effectsReport: (schema) => effectsReport(PG_URL, schema),
  async clockPast(since, ms) {
    const [row] = await sql<{ past: boolean }>(
      PG_URL,
      `SELECT now() > $1::timestamptz + $2 * interval '1 millisecond' AS past`,
      [since, ms],
    );
    return row!.past;
  },
  async startWire() {
    const proxy = await PgProxy.start(PG_URL);
    // The PostgreSQL store names its prepared statements '<digest>_<statement>'.
    return {
      url: proxy.urlFor(PG_URL),
      count: (statement, from) => proxy.count(`_${statement}`, from),
      holdReplyAfter: (statement) => proxy.holdReplyAfter((s) => s.name.endsWith(`_${statement}`)),
      close: () => proxy.close(),
    };
  },
};
