/**
 * The scale recommendation on PostgreSQL (issue 26): the contract (scale-contract.ts) on
 * `<schema>.desired_readers(queue_name)`, what KEDA's postgresql scaler queries, and the plan of
 * its statement (indexes only).
 */
import pg from 'pg';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { createPostgresStore } from '../../lib/src/store/postgres/postgres.connect.js';
import { pgScalerGrantsScript } from '../../lib/src/store/postgres/postgres.migrations.js';
import { pgQueries } from '../../lib/src/store/postgres/postgres.queries.js';
import { dropPgSchema, PG_URL, sql, uniqueSchema } from '../helpers/databases.js';
import { describeScaleContract } from './scale-contract.js';

async function withClient<T>(work: (client: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: PG_URL });
  await client.connect();
  try {
    return await work(client);
  } finally {
    await client.end();
  }
}

const readOn = async (client: pg.Client, schema: string, queue: string) =>
  (await client.query<{ n: number }>(`SELECT "${schema}".desired_readers($1) AS n`, [queue])).rows[0]!.n;

describeScaleContract({
  name: 'postgres',
  openStore: async (schema) => createPostgresStore({ url: PG_URL, poolSize: 4 }, { schema }),
  desiredReaders: (schema, queue) => withClient((client) => readOn(client, schema, queue)),
  async addCompletions(schema, queue, minutesAgo, completed, busyMs) {
    await sql(
      PG_URL,
      `INSERT INTO "${schema}".throughput (minute, queue, completed, busy_ms)
       VALUES (date_trunc('minute', now()) - make_interval(mins => $2), $1, $3, $4)`,
      [queue, minutesAgo, completed, busyMs],
    );
  },
  asGrantedScaler: (schema, principal, work) =>
    withClient(async (client) => {
      await client.query(`CREATE ROLE "${principal}" NOLOGIN`);
      await client.query(pgScalerGrantsScript(schema, principal));
      await client.query('BEGIN');
      try {
        await client.query(`SET LOCAL ROLE "${principal}"`);
        return await work({
          desiredReaders: (queue) => readOn(client, schema, queue),
          readJobs: () => client.query(`SELECT count(*) FROM "${schema}".jobs`),
        });
      } finally {
        await client.query('ROLLBACK');
      }
    }),
  dropSchema: (schema) => dropPgSchema(schema),
  dropPrincipal: async (principal) => void (await sql(PG_URL, `DROP ROLE IF EXISTS "${principal}"`)),
});

const schema = uniqueSchema('scaleplan');
let client: pg.Client;
beforeAll(async () => {
  const store = createPostgresStore({ url: PG_URL, poolSize: 1 }, { schema });
  await store.migrate('auto');
  await store.close();
  client = new pg.Client({ connectionString: PG_URL });
  await client.connect();
});
afterAll(async () => {
  await client?.end();
  await dropPgSchema(schema);
});

it('postgres: the scale inputs statement reads only indexes of the jobs and groups tables (seq scans off: none is needed)', async () => {
  await client.query('BEGIN');
  try {
    await client.query('SET LOCAL enable_seqscan = off');
    const text = pgQueries(schema).scaleInputs.replace(/\$1/g, "'scale.1'");
    const { rows } = await client.query<{ 'QUERY PLAN': unknown }>(`EXPLAIN (FORMAT JSON) ${text}`);
    const scans: string[] = [];
    const walk = (node: Record<string, unknown>) => {
      if (typeof node['Relation Name'] === 'string') scans.push(`${node['Node Type']} on ${node['Relation Name']}`);
      for (const child of (node.Plans as Record<string, unknown>[] | undefined) ?? []) walk(child);
    };
    walk((rows[0]!['QUERY PLAN'] as { Plan: Record<string, unknown> }[])[0]!.Plan);
    const onLiveTables = scans.filter((scan) => / on (jobs|groups)$/.test(scan));
    expect(onLiveTables.length).toBeGreaterThan(5);
    expect(
      onLiveTables.filter((scan) => scan.startsWith('Seq Scan')),
      onLiveTables.join('; '),
    ).toEqual([]);
  } finally {
    await client.query('ROLLBACK');
  }
});
