import { afterAll, beforeAll, expect, it } from 'vitest';
import { prepareJob } from '../../lib/src/core/producer/job-validation.js';
import { createPostgresStore } from '../../lib/src/store/postgres/postgres.connect.js';
import type { PostgresQueueStore } from '../../lib/src/store/postgres/postgres.store.js';
import { dropPgSchema, PG_URL, uniqueSchema } from '../helpers/databases.js';

const LIMITS = { maxPayloadBytes: 1024 * 1024, defaultMaxAttempts: 3 };
const schema = uniqueSchema('rvbulk');
let a: PostgresQueueStore;
let b: PostgresQueueStore;

beforeAll(async () => {
  a = createPostgresStore({ url: PG_URL, poolSize: 1 }, { schema });
  b = createPostgresStore({ url: PG_URL, poolSize: 1 }, { schema });
  await a.migrate('auto');
});
afterAll(async () => {
  await a.close();
  await b.close();
  await dropPgSchema(schema);
});

it('two concurrent bulk enqueues sharing idempotency keys (in different orders) both succeed', async () => {
  for (let round = 0; round < 5; round++) {
    const queue = `bulk.${round}`;
    const keys = Array.from({ length: 2_000 }, (_, i) => `k-${i}`);
    const batch = (order: string[]) => order.map((key) => prepareJob(queue, { key }, { idempotencyKey: key }, LIMITS));
    const [ra, rb] = await Promise.all([a.enqueue(batch(keys)), b.enqueue(batch([...keys].reverse()))]);
    // Each key names one job, whichever batch created it.
    const byKeyA = new Map(keys.map((k, i) => [k, ra[i]!.jobId]));
    const byKeyB = new Map([...keys].reverse().map((k, i) => [k, rb[i]!.jobId]));
    expect(keys.every((k) => byKeyA.get(k) === byKeyB.get(k))).toBe(true);
  }
});
