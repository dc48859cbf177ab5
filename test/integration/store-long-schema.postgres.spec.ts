import { afterEach, expect, it } from 'vitest';
import { prepareJob } from '../../lib/src/core/producer/job-validation.js';
import { createPostgresStore } from '../../lib/src/store/postgres/postgres.connect.js';
import type { PostgresQueueStore } from '../../lib/src/store/postgres/postgres.store.js';
import { dropPgSchema, PG_URL } from '../helpers/databases.js';
import { deferred } from '../helpers/wait-for.js';
import { randomBytes } from 'node:crypto';

const LIMITS = { maxPayloadBytes: 1024 * 1024, defaultMaxAttempts: 3 };
const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** A valid schema name (the validator allows up to 63 characters) of the given length. */
function schemaOfLength(length: number): string {
  const head = `t_long_${randomBytes(4).toString('hex')}_`;
  return (head + 'x'.repeat(64)).slice(0, length);
}

async function open(schema: string): Promise<PostgresQueueStore> {
  const store = createPostgresStore({ url: PG_URL, poolSize: 1 }, { schema });
  cleanups.push(async () => {
    await store.close();
    await dropPgSchema(schema);
  });
  await store.migrate('auto');
  return store;
}

it('a 53-character schema (valid): hot statements after the first one fail on the same connection', async () => {
  const store = await open(schemaOfLength(53));
  await store.enqueue([prepareJob('q', { n: 1 }, {}, LIMITS)]);
  // Prepared names 'sqlqueue_<schema>_claim' and 'sqlqueue_<schema>_enqueueOne' share their first
  // 63 bytes, which is all PostgreSQL keeps of a prepared statement name.
  await expect(store.claim({ queue: 'q', limit: 1, leaseMs: 30_000, workerId: 'w' })).resolves.toHaveLength(1);
});

it('a 42-character schema (valid): a keyed bulk enqueue after a plain bulk enqueue fails', async () => {
  // 'sqlqueue_<schema>_enqueueMany' and 'sqlqueue_<schema>_enqueueManyUniform' agree on 63 bytes.
  const store = await open(schemaOfLength(42));
  await store.enqueue([prepareJob('q', { n: 0 }, {}, LIMITS), prepareJob('q', { n: 1 }, {}, LIMITS)]);
  const results = await store.enqueue([
    prepareJob('q', { n: 2 }, { idempotencyKey: 'b' }, LIMITS),
    prepareJob('q', { n: 3 }, { idempotencyKey: 'c' }, LIMITS),
  ]);
  expect(results.map((r) => r.created)).toEqual([true, true]);
});

it('a 63-character schema (valid): a NOTIFY wake-up reaches a LISTEN of the same store', async () => {
  const store = await open(schemaOfLength(63));
  const woke = deferred<string>();
  const unlisten = await store.listen((queue) => woke.resolve(queue));
  cleanups.push(unlisten);
  await store.notify('q');
  await expect(
    Promise.race([woke.promise, new Promise((r) => setTimeout(() => r('no wake-up'), 3_000))]),
  ).resolves.toBe('q');
});
