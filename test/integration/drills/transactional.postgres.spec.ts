/** The exactly-once drill of transactional handlers (transactional.drills.ts) on PostgreSQL. */
import { createPostgresStore } from '../../../lib/src/store/postgres/postgres.connect.js';
import { dropPgSchema, PG_URL, sql } from '../../helpers/databases.js';
import { transactionalDrills, type ExactlyOnceReport } from './transactional.drills.js';

transactionalDrills({
  dialect: 'postgres',
  url: PG_URL,
  openStore: (schema) => createPostgresStore({ url: PG_URL, poolSize: 4 }, { schema }),
  async createEffectTable(schema) {
    await sql(
      PG_URL,
      `CREATE TABLE "${schema}".tx_effects (job_id bigint NOT NULL, queue text NOT NULL, pid int NOT NULL,
         at timestamptz NOT NULL DEFAULT clock_timestamp())`,
    );
  },
  dropSchema: (schema) => dropPgSchema(schema),
  async doneCount(schema) {
    const [row] = await sql<{ n: number }>(
      PG_URL,
      `SELECT count(*)::int AS n FROM "${schema}".jobs WHERE queue IN ('tx', 'tx-next') AND state = 'done'`,
    );
    return row!.n;
  },
  async report(schema) {
    const [row] = await sql<Record<keyof ExactlyOnceReport, number>>(
      PG_URL,
      `WITH e AS (SELECT job_id, count(*) AS n FROM "${schema}".tx_effects GROUP BY job_id),
            j AS (SELECT * FROM "${schema}".jobs WHERE queue IN ('tx', 'tx-next')),
            c AS (SELECT (payload->>'parent')::bigint AS parent, count(*) AS n FROM j WHERE queue = 'tx-next' GROUP BY 1)
       SELECT (SELECT count(*)::int FROM j) AS jobs,
              (SELECT count(*)::int FROM j WHERE state <> 'done') AS not_done,
              (SELECT count(*)::int FROM j LEFT JOIN e ON e.job_id = j.id WHERE e.job_id IS NULL) AS without_effect,
              (SELECT count(*)::int FROM e WHERE n > 1) AS with_two,
              (SELECT count(*)::int FROM e LEFT JOIN j ON j.id = e.job_id WHERE j.id IS NULL OR j.state <> 'done') AS stray,
              (SELECT count(*)::int FROM j LEFT JOIN c ON c.parent = j.id WHERE j.queue = 'tx' AND c.parent IS NULL) AS first_without_child,
              (SELECT count(*)::int FROM c WHERE n > 1) AS first_with_two,
              (SELECT count(*)::int FROM j WHERE attempts > 1) AS reruns`,
    );
    return row!;
  },
});
