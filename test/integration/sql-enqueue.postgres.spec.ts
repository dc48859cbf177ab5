/**
 * Enqueue from SQL on PostgreSQL (issue 25): the contract (sql-enqueue-contract.ts) on
 * `<schema>.enqueue(...)`, and the NOTIFY it sends at commit.
 */
import pg from 'pg';
import { afterAll, expect, it } from 'vitest';
import { pgEnqueueGrantsScript } from '../../lib/src/store/postgres/postgres.migrations.js';
import { createPostgresStore } from '../../lib/src/store/postgres/postgres.connect.js';
import { dropPgSchema, PG_URL, sql, uniqueSchema } from '../helpers/databases.js';
import { describeSqlEnqueueContract, type SqlEnqueueSession } from './sql-enqueue-contract.js';
import type { SqlEnqueueCall } from './sql-enqueue-cases.js';

/** The function's call for one SqlEnqueueCall, with named arguments for what it sets. */
function pgEnqueueCall(schema: string, call: SqlEnqueueCall): { text: string; params: unknown[] } {
  const params: unknown[] = [call.queue, call.payloadText ?? JSON.stringify(call.payload)];
  const named: string[] = [];
  const add = (name: string, value: unknown, cast: string) => {
    if (value === undefined) return;
    params.push(value instanceof Date ? value.toISOString() : value);
    named.push(`, ${name} => $${params.length}::${cast}`);
  };
  const o = call.options ?? {};
  add('idempotency_key', o.idempotencyKey, 'text');
  add('group_key', o.groupKey, 'text');
  add('delay_ms', o.delayMs, 'bigint');
  add('priority', o.priority, 'integer');
  add('max_attempts', o.maxAttempts, 'integer');
  add('run_at', o.runAt, 'timestamptz');
  add('concurrency_key', o.concurrencyKey, 'text');
  return {
    text: `SELECT job_id::text AS job_id, created FROM "${schema}".enqueue($1, $2::jsonb${named.join('')})`,
    params,
  };
}

async function pgSession(schema: string): Promise<SqlEnqueueSession> {
  const client = new pg.Client({ connectionString: PG_URL });
  await client.connect();
  const s = `"${schema}"`;
  return {
    async enqueue(call) {
      const { text, params } = pgEnqueueCall(schema, call);
      const { rows } = await client.query<{ job_id: string; created: boolean }>(text, params);
      return { jobId: rows[0]!.job_id, created: rows[0]!.created };
    },
    begin: async () => void (await client.query('BEGIN')),
    commit: async () => void (await client.query('COMMIT')),
    rollback: async () => void (await client.query('ROLLBACK')),
    async createOrderTrigger(queue) {
      await client.query(`CREATE TABLE ${s}.orders (id bigint PRIMARY KEY, total numeric NOT NULL)`);
      await client.query(`CREATE FUNCTION ${s}.order_placed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM ${s}.enqueue('${queue}', jsonb_build_object('orderId', NEW.id, 'total', NEW.total),
                       idempotency_key => 'order:' || NEW.id);
  RETURN NEW;
END $$`);
      await client.query(
        `CREATE TRIGGER order_placed AFTER INSERT ON ${s}.orders FOR EACH ROW EXECUTE FUNCTION ${s}.order_placed()`,
      );
    },
    insertOrder: async (id, total) => void (await client.query(`INSERT INTO ${s}.orders VALUES ($1, $2)`, [id, total])),
    async asPrincipal(principal, work) {
      await client.query('BEGIN');
      try {
        await client.query(`SET LOCAL ROLE "${principal}"`);
        return await work();
      } finally {
        await client.query('ROLLBACK');
      }
    },
    createPrincipal: async (principal) => void (await client.query(`CREATE ROLE "${principal}" NOLOGIN`)),
    grantEnqueuer: async (principal) => void (await client.query(pgEnqueueGrantsScript(schema, principal))),
    readJobs: () => client.query(`SELECT count(*) FROM ${s}.jobs`),
    close: () => client.end(),
  };
}

describeSqlEnqueueContract({
  name: 'postgres',
  openStore: async (schema) => createPostgresStore({ url: PG_URL, poolSize: 4 }, { schema }),
  connect: pgSession,
  refusalMessage(error) {
    expect((error as pg.DatabaseError).code).toBe('22023');
    return (error as Error).message;
  },
  notPermitted: /permission denied for (function enqueue|schema)/,
  dropSchema: (schema) => dropPgSchema(schema),
  dropPrincipal: async (principal) => void (await sql(PG_URL, `DROP ROLE IF EXISTS "${principal}"`)),
});

const schema = uniqueSchema('sqlenqwake');
afterAll(() => dropPgSchema(schema));

it('postgres: the function wakes listening consumers when its transaction commits, never before', async () => {
  const store = await createPostgresStore({ url: PG_URL, poolSize: 2 }, { schema });
  const session = await pgSession(schema);
  try {
    await store.migrate('auto');
    const woken: string[] = [];
    const unlisten = await store.listen!((queue) => woken.push(queue));
    try {
      await session.begin();
      await session.enqueue({ queue: 'woken', payload: {} });
      await new Promise((resolve) => setTimeout(resolve, 200));
      expect(woken).toEqual([]);
      await session.commit();
      await expect.poll(() => woken, { timeout: 5_000 }).toEqual(['woken']);
    } finally {
      await unlisten();
    }
  } finally {
    await session.close();
    await store.close();
  }
});
