import pg from 'pg';
import { expect, it } from 'vitest';
import { prepareJob } from '../../lib/src/core/producer/job-validation.js';
import { createPostgresStore } from '../../lib/src/store/postgres/postgres.connect.js';
import { dropPgSchema, PG_URL, sql, uniqueSchema } from '../helpers/databases.js';
import { describeStoreContract, type StoreTarget } from './store-contract.js';
import { describeFlowContract } from './store-flow-contract.js';
import { describeHandlerTransactionContract } from './store-handler-transaction.js';

const target: StoreTarget = {
  name: 'postgres',
  concurrentSessions: true,
  scale: 1,
  async openStore(schema, options) {
    return createPostgresStore({ url: PG_URL, poolSize: options?.poolSize ?? 4 }, { schema });
  },
  async beginTransaction() {
    const client = new pg.Client({ connectionString: PG_URL });
    await client.connect();
    await client.query('BEGIN');
    const finish = async (command: string) => {
      try {
        await client.query(command);
      } finally {
        await client.end();
      }
    };
    return { handle: client, commit: () => finish('COMMIT'), rollback: () => finish('ROLLBACK') };
  },
  dropSchema: (schema) => dropPgSchema(schema),
  async bumpSchemaVersion(schema, version) {
    await sql(PG_URL, `INSERT INTO "${schema}".schema_version (version, description) VALUES ($1, 'from the future')`, [
      version,
    ]);
  },
};
describeStoreContract(target);
describeFlowContract(target);
describeHandlerTransactionContract(target);

it('postgres: a uniform batch over the JSON-document bound (64M characters) is stored whole and in order', async () => {
  const schema = uniqueSchema('pgbulklarge');
  const store = await createPostgresStore({ url: PG_URL, poolSize: 1 }, { schema });
  try {
    await store.migrate('auto');
    const limits = { maxPayloadBytes: 64 * 1024 * 1024, defaultMaxAttempts: 3 };
    // 3 × 22M characters: over the 64M-character document bound, each job under the byte limit.
    const jobs = ['a', 'b', 'c'].map((letter) => prepareJob('large', letter.repeat(22 * 1024 * 1024), {}, limits));
    const results = await store.enqueue(jobs);
    expect(results.map((r) => r.created)).toEqual([true, true, true]);
    const ids = results.map((r) => BigInt(r.jobId));
    expect(ids[0]! < ids[1]! && ids[1]! < ids[2]!).toBe(true);
    const [row] = await sql<{ first: string; len: number }>(
      PG_URL,
      `SELECT left(payload #>> '{}', 1) AS first, length(payload #>> '{}') AS len FROM "${schema}".jobs WHERE id = $1`,
      [results[1]!.jobId],
    );
    expect(row).toEqual({ first: 'b', len: 22 * 1024 * 1024 });
  } finally {
    await store.close();
    await dropPgSchema(schema);
  }
}, 60_000);

it('postgres: retention deletes the per-key rate rows of keys with no start in their window and no wait ahead', async () => {
  const schema = uniqueSchema('pgflowclean');
  const store = await createPostgresStore({ url: PG_URL, poolSize: 1 }, { schema });
  try {
    await store.migrate('auto');
    const limits = {
      globalConcurrency: null,
      concurrencyPerKey: null,
      rateLimit: null,
      rateLimitPerKey: { max: 5, perMs: 1_000 },
    };
    await store.recordQueueSettings([{ queue: 'keyrate', maxAttempts: 3, limits }]);
    const jobs = ['old', 'recent', 'waiting'].map((key) =>
      prepareJob('keyrate', {}, { concurrencyKey: key }, { maxPayloadBytes: 1024, defaultMaxAttempts: 3 }),
    );
    await store.enqueue(jobs);
    const claimed = await store.claim({ queue: 'keyrate', limit: 10, leaseMs: 60_000, workerId: 'w', limited: true });
    expect(claimed).toHaveLength(3);
    await sql(
      PG_URL,
      `UPDATE "${schema}".flow_state SET updated_at = now() - interval '2 minutes' WHERE lane IN ('old', 'waiting')`,
    );
    await sql(
      PG_URL,
      `UPDATE "${schema}".flow_state SET blocked_until = now() + interval '1 hour' WHERE lane = 'waiting'`,
    );
    await store.cleanup({
      doneRetentionMs: 86_400_000,
      deadRetentionMs: null,
      idempotencyRetentionMs: 86_400_000,
      batchSize: 100,
    });
    const lanes = await sql<{ lane: string }>(PG_URL, `SELECT lane FROM "${schema}".flow_state ORDER BY lane`);
    expect(lanes.map((row) => row.lane)).toEqual(['', 'recent', 'waiting']);
  } finally {
    await store.close();
    await dropPgSchema(schema);
  }
});
