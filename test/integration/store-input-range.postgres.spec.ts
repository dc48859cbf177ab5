import { afterAll, beforeAll, expect, it } from 'vitest';
import { QueueProducerCore } from '../../lib/src/core/producer/producer.js';
import { SqlQueueValidationError } from '../../lib/src/core/errors.js';
import { WakeBus } from '../../lib/src/core/wake.js';
import { createPostgresStore } from '../../lib/src/store/postgres/postgres.connect.js';
import type { PostgresQueueStore } from '../../lib/src/store/postgres/postgres.store.js';
import { dropPgSchema, PG_URL, uniqueSchema } from '../helpers/databases.js';

const schema = uniqueSchema('rvjobid');
let store: PostgresQueueStore;
let producer: QueueProducerCore;

beforeAll(async () => {
  store = createPostgresStore({ url: PG_URL, poolSize: 1 }, { schema });
  await store.migrate('auto');
  producer = new QueueProducerCore(store, { maxPayloadBytes: 1024, maxAttemptsFor: () => 3 }, new WakeBus(), null);
});
afterAll(async () => {
  await store.close();
  await dropPgSchema(schema);
});

// 19 digits pass the producer's id check (^[1-9]\d{0,18}$) but exceed bigint (9223372036854775807).
const TOO_BIG = '9999999999999999999';

it('getJob / listDead of an id past the bigint range is "no such job" (or a validation error), not a database error', async () => {
  await expect(producer.getJob(TOO_BIG).catch((e: unknown) => e)).resolves.toSatisfy(
    (v: unknown) => v === null || v instanceof SqlQueueValidationError,
  );
  await expect(producer.listDead('q', { afterId: TOO_BIG }).catch((e: unknown) => e)).resolves.toSatisfy(
    (v: unknown) => (v as { jobs?: unknown[] }).jobs?.length === 0 || v instanceof SqlQueueValidationError,
  );
});

it('purgeDead takes olderThanMs up to ten years, and refuses more before any SQL', async () => {
  // now() minus ~285,000 years is outside timestamptz: such a value must be a validation error.
  await expect(producer.purgeDead('q', { olderThanMs: 10 * 365 * 24 * 3600 * 1000 })).resolves.toBe(0);
  await expect(producer.purgeDead('q', { olderThanMs: Number.MAX_SAFE_INTEGER })).rejects.toBeInstanceOf(
    SqlQueueValidationError,
  );
});
