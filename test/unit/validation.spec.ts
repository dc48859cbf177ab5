import { describe, expect, it } from 'vitest';
import { SqlQueueConfigError, SqlQueueValidationError } from '../../lib/src/core/errors.js';
import { resolveConsumerOptions, resolveQueueOptions, validateQueueMap } from '../../lib/src/core/options.js';
import { QueueProducerCore } from '../../lib/src/core/producer/producer.js';
import type { QueueStore } from '../../lib/src/core/queue-store.js';
import { assertSchemaName, nearestName } from '../../lib/src/core/validation.js';
import { prepareJob } from '../../lib/src/core/producer/job-validation.js';
import { WakeBus } from '../../lib/src/core/wake.js';
import { createQueueStore } from '../../lib/src/store/create-store.js';
import { assertMssqlSchemaName } from '../../lib/src/store/mssql/mssql.identifiers.js';
import { resolveModuleOptions } from '../../lib/src/nest/sql-queue.options.js';

const limits = { maxPayloadBytes: 100, defaultMaxAttempts: 7 };

describe('enqueue arguments are checked before any SQL runs', () => {
  it('prepares a valid job with defaults', () => {
    expect(prepareJob('emails', { to: 'a@b' }, undefined, limits)).toEqual({
      queue: 'emails',
      payload: '{"to":"a@b"}',
      priority: 0,
      runAt: null,
      delayMs: 0,
      groupKey: null,
      concurrencyKey: null,
      idempotencyKey: null,
      // Not given: the enqueue statement takes the queue's recorded setting, else the default.
      maxAttempts: null,
      defaultMaxAttempts: 7,
    });
    expect(prepareJob('emails', {}, { maxAttempts: 2 }, limits)).toMatchObject({
      maxAttempts: 2,
      defaultMaxAttempts: 7,
    });
  });

  it('accepts the text \\u0000 (an escaped backslash, no NUL) and non-ASCII payloads up to the byte limit', () => {
    expect(prepareJob('q', { s: '\\u0000' }, {}, limits).payload).toBe('{"s":"\\\\u0000"}');
    // 32 three-byte characters plus 8 bytes of JSON: 104 bytes, over 100; 30 of them fit.
    expect(() => prepareJob('q', { s: '€'.repeat(32) }, {}, limits)).toThrow(/104 bytes of JSON/);
    expect(prepareJob('q', { s: '€'.repeat(30) }, {}, limits).payload).toContain('€');
    // A pair of surrogates is one character (here U+1F600), stored as is.
    expect(prepareJob('q', { s: '\ud83d\ude00' }, { idempotencyKey: 'k\ud83d\ude00' }, limits).payload).toBe(
      '{"s":"\ud83d\ude00"}',
    );
  });

  it.each([
    ['a queue name with a space', () => prepareJob('a b', {}, {}, limits), /queue name 'a b' is invalid/],
    ['a queue name with a quote', () => prepareJob("x'--", {}, {}, limits), /queue name/],
    ['a non-serializable payload', () => prepareJob('q', { n: 1n }, {}, limits), /not JSON-serializable/],
    ['a function payload', () => prepareJob('q', () => 1, {}, limits), /not JSON-serializable \(got function\)/],
    [
      'a payload over the size limit',
      () => prepareJob('q', 'x'.repeat(200), {}, limits),
      /202 bytes of JSON, over the limit of 100/,
    ],
    ['a payload with U+0000', () => prepareJob('q', { s: 'a\u0000' }, {}, limits), /contains U\+0000/],
    ['a payload with an unpaired surrogate', () => prepareJob('q', { s: 'a\ud800' }, {}, limits), /unpaired surrogate/],
    [
      "an idempotency key in the recurring jobs' reserved 'schedule:' namespace",
      () => prepareJob('q', {}, { idempotencyKey: 'schedule:report:2026-12-01T00:00:00.000Z' }, limits),
      /idempotencyKey 'schedule:report:2026-12-01T00:00:00.000Z' starts with 'schedule:', which is reserved for the jobs of recurring schedules/,
    ],
    [
      'an idempotency key with U+0000',
      () => prepareJob('q', {}, { idempotencyKey: 'k\u0000' }, limits),
      /idempotencyKey contains U\+0000/,
    ],
    [
      'a group key with an unpaired surrogate',
      () => prepareJob('q', {}, { groupKey: '\udc00g' }, limits),
      /groupKey contains U\+0000 or an unpaired surrogate/,
    ],
    [
      'a payload key with U+0000 after an escaped backslash',
      () => prepareJob('q', { ['\\\u0000']: 1 }, {}, limits),
      /contains U\+0000/,
    ],
    ['a negative delay', () => prepareJob('q', {}, { delayMs: -1 }, limits), /delayMs must be an integer from 0/],
    ['a fractional delay', () => prepareJob('q', {}, { delayMs: 1.5 }, limits), /delayMs/],
    ['runAt and delayMs together', () => prepareJob('q', {}, { delayMs: 1, runAt: new Date() }, limits), /not both/],
    [
      'a group key and a concurrency key together',
      () => prepareJob('q', {}, { groupKey: 'g', concurrencyKey: 'k' }, limits),
      /give groupKey or concurrencyKey, not both/,
    ],
    [
      'an empty concurrency key',
      () => prepareJob('q', {}, { concurrencyKey: '' }, limits),
      /concurrencyKey must be a non-empty string/,
    ],
    [
      'an invalid date',
      () => prepareJob('q', {}, { runAt: new Date(Number.NaN) }, limits),
      /runAt must be a valid Date/,
    ],
    [
      'maxAttempts below 1',
      () => prepareJob('q', {}, { maxAttempts: 0 }, limits),
      /maxAttempts must be an integer from 1/,
    ],
    ['priority out of range', () => prepareJob('q', {}, { priority: 40_000 }, limits), /priority/],
    [
      'an empty idempotency key',
      () => prepareJob('q', {}, { idempotencyKey: '' }, limits),
      /idempotencyKey must be a non-empty/,
    ],
    [
      'a key with trailing space',
      () => prepareJob('q', {}, { idempotencyKey: 'k ' }, limits),
      /must not end with whitespace/,
    ],
    ['a long group key', () => prepareJob('q', {}, { groupKey: 'g'.repeat(256) }, limits), /groupKey/],
  ])('rejects %s', (_name, call, message) => {
    expect(call).toThrow(SqlQueueValidationError);
    expect(call).toThrow(message);
  });

  it('names the bad item of a bulk call', () => {
    expect(() => prepareJob('q', {}, { priority: 0.5 }, limits, 'item 3')).toThrow(
      /enqueue to 'q' \(item 3\): priority/,
    );
  });
});

describe('unknown enqueue options are refused before the database is touched', () => {
  // Every store call fails the test: validation must answer first.
  const untouchable = new Proxy({} as QueueStore, {
    get: (_target, name) => () => {
      throw new Error(`the store was called (${String(name)})`);
    },
  });
  const producer = new QueueProducerCore(
    untouchable,
    { maxPayloadBytes: 1024, maxAttemptsFor: () => 25 },
    new WakeBus(),
    null,
  );

  it('names the key, a near valid name and the valid ones', async () => {
    const refused = producer.enqueue('emails', {}, { delay: 5 } as never);
    await expect(refused).rejects.toThrow(SqlQueueValidationError);
    await expect(refused).rejects.toThrow(
      "enqueue to 'emails' options: unknown option 'delay' (did you mean 'delayMs'?); valid options: idempotencyKey, runAt, delayMs, priority, groupKey, concurrencyKey, maxAttempts, transaction",
    );
    await expect(producer.enqueue('emails', {}, { max_attempts: 3 } as never)).rejects.toThrow(
      /unknown option 'max_attempts' \(did you mean 'maxAttempts'\?\)/,
    );
    await expect(producer.enqueue('emails', {}, { colour: 'red' } as never)).rejects.toThrow(
      /unknown option 'colour'; valid options: /,
    );
  });

  it('checks every bulk item and the call options', async () => {
    await expect(
      producer.enqueueMany('emails', [{ payload: 1 }, { payload: 2, idempotency: 'k' } as never]),
    ).rejects.toThrow(
      /enqueueMany to 'emails' \(item 1\): unknown option 'idempotency' \(did you mean 'idempotencyKey'\?\); valid options: payload, /,
    );
    // The transaction is the call's, not an item's.
    await expect(producer.enqueueMany('emails', [{ payload: 1, transaction: {} } as never])).rejects.toThrow(
      /\(item 0\): unknown option 'transaction'/,
    );
    await expect(producer.enqueueMany('emails', [{ payload: 1 }], { transation: {} } as never)).rejects.toThrow(
      /enqueueMany to 'emails' options: unknown option 'transation' \(did you mean 'transaction'\?\)/,
    );
    await expect(producer.enqueue('emails', {}, null as never)).rejects.toThrow(/options must be an object, got null/);
  });

  it('checks purgeDead ids before the database, and refuses ids with olderThanMs', async () => {
    await expect(producer.purgeDead('emails', { ids: ['1'], olderThanMs: 5 })).rejects.toThrow(
      'purgeDead takes ids or olderThanMs, not both',
    );
    await expect(producer.purgeDead('emails', { ids: ['12x'] })).rejects.toThrow(SqlQueueValidationError);
    await expect(producer.purgeDead('emails', { ids: 'all' as never })).rejects.toThrow(SqlQueueValidationError);
  });

  it('checks pauseQueue and resumeQueue arguments before the database', async () => {
    await expect(producer.pauseQueue('not a queue')).rejects.toThrow(/queue name/);
    await expect(producer.pauseQueue('emails', { reason: 42 } as never)).rejects.toThrow(
      "pauseQueue('emails'): reason must be a string of at most 1000 characters, got 42",
    );
    await expect(producer.pauseQueue('emails', { reason: 'x'.repeat(1001) })).rejects.toThrow(
      /reason must be a string of at most 1000 characters/,
    );
    await expect(producer.pauseQueue('emails', { reason: 'a\u0000b' })).rejects.toThrow(/U\+0000/);
    await expect(producer.pauseQueue('emails', { why: 'x' } as never)).rejects.toThrow(
      /pauseQueue options: unknown option 'why'; valid options: reason/,
    );
    await expect(producer.resumeQueue('')).rejects.toThrow(SqlQueueValidationError);
  });

  it('suggests a near name only when one is clearly nearest', () => {
    const names = ['minReaders', 'maxReaders', 'maxAttempts', 'maxPollMs'];
    expect(nearestName('maxAttempt', names)).toBe('maxAttempts');
    expect(nearestName('MaxReaders', names)).toBe('maxReaders');
    expect(nearestName('max', names)).toBeNull();
    expect(nearestName('readers', names)).toBeNull();
    expect(nearestName('colour', names)).toBeNull();
  });
});

describe('identifiers', () => {
  it.each(['sqlqueue', 'Queue_2', '_private'])('accepts schema %s', (name) => {
    expect(assertSchemaName(name)).toBe(name);
  });

  it.each(['x"; DROP TABLE jobs; --', 'a.b', 'a]b', '1abc', '', 'é', 'a'.repeat(64)])('refuses schema %j', (name) => {
    expect(() => assertSchemaName(name)).toThrow(SqlQueueConfigError);
  });

  it('refuses a bad pool size or read timeout before connecting', async () => {
    const connection = { dialect: 'postgres' as const, url: 'postgres://nobody@127.0.0.1:1/none' };
    await expect(createQueueStore({ ...connection, poolSize: 0 }, { schema: 'sq' })).rejects.toThrow(
      /connection\.poolSize must be an integer from 1/,
    );
    await expect(createQueueStore({ ...connection, queryTimeoutMs: -1 }, { schema: 'sq' })).rejects.toThrow(
      /connection\.queryTimeoutMs must be an integer from 1/,
    );
  });

  it('refuses T-SQL reserved keywords as SQL Server schema names, whatever their case', () => {
    expect(() => assertMssqlSchemaName('public')).toThrow(/reserved keyword/);
    expect(() => assertMssqlSchemaName('User')).toThrow(/reserved keyword/);
    expect(assertMssqlSchemaName('jobs')).toBe('jobs');
  });
});

describe('options fail at boot with the place and the rule', () => {
  const consumer = resolveConsumerOptions(undefined);

  it('resolves queue options: handler over module over defaults', () => {
    const resolved = resolveQueueOptions(
      'q',
      { module: { maxReaders: 8, leaseMs: 5_000 }, handler: { maxReaders: 3 } },
      consumer,
    );
    expect(resolved).toMatchObject({
      minReaders: 1,
      maxReaders: 3,
      batchSize: 100,
      leaseMs: 5_000,
      prefetch: 'auto',
      maxAttempts: 25,
    });
    expect(resolved.minPollMs).toBe(50);
    expect(resolved.maxPollMs).toBe(2_000);
  });

  it.each([
    [{ maxReaders: 0 }, /maxReaders must be an integer from 1/],
    [{ leaseMs: 10 }, /leaseMs must be an integer from 100/],
    [{ batchSize: 5_000 }, /batchSize/],
    [{ readers: 2 }, /unknown option 'readers'/],
    [{ prefetch: 'lots' }, /prefetch must be 'auto' or an integer from 0 to 10000, got 'lots'/],
    [{ prefetch: -1 }, /prefetch must be 'auto' or an integer from 0 to 10000, got -1/],
    [{ minReaders: 4, maxReaders: 2 }, /minReaders \(4\) is greater than maxReaders \(2\)/],
    [{ minPollMs: 500, maxPollMs: 100 }, /minPollMs \(500\) is greater than maxPollMs \(100\)/],
    [{ backoff: { type: 'fixed' } }, /backoff\.delayMs/],
    [{ globalConcurrency: 0 }, /globalConcurrency must be an integer from 1/],
    [{ concurrencyPerKey: 1.5 }, /concurrencyPerKey must be an integer from 1/],
    [{ rateLimit: { max: 10 } }, /rateLimit must give both max and perMs/],
    [{ rateLimit: { max: 20_000, perMs: 1_000 } }, /rateLimit\.max must be an integer from 1 to 10000/],
    [{ rateLimitPerKey: { max: 5, perMs: 0 } }, /rateLimitPerKey\.perMs must be an integer from 1/],
    [{ rateLimit: { max: 5, perMs: 1_000, burst: 2 } }, /rateLimit: unknown option 'burst'/],
    [{ concurrencyPerKey: 2, groupBatchSize: 4 }, /groupBatchSize cannot be combined with flow limits/],
  ])('rejects %j', (options, message) => {
    expect(() => resolveQueueOptions('q', { handler: options as never }, consumer, "@QueueHandler('q') on X")).toThrow(
      message,
    );
  });

  it('flow limits: none by default; given ones resolve; queue-wide and rate limits prefetch nothing unless told', () => {
    expect(resolveQueueOptions('q', {}, consumer).limits).toBeNull();
    const limited = resolveQueueOptions(
      'q',
      { module: { concurrencyPerKey: 2, rateLimit: { max: 100, perMs: 1_000 } }, handler: { globalConcurrency: 10 } },
      consumer,
    );
    expect(limited.limits).toEqual({
      globalConcurrency: 10,
      concurrencyPerKey: 2,
      rateLimit: { max: 100, perMs: 1_000 },
      rateLimitPerKey: null,
    });
    expect(limited.prefetch).toBe(0);
    expect(resolveQueueOptions('q', { handler: { globalConcurrency: 3, prefetch: 5 } }, consumer).prefetch).toBe(5);
    // concurrencyPerKey alone: a prefetched job holds only its own key's slot.
    expect(resolveQueueOptions('q', { handler: { concurrencyPerKey: 1 } }, consumer).prefetch).toBe('auto');
  });

  it('checks the module map and module-level options', () => {
    expect(() => validateQueueMap({ 'bad name': {} })).toThrow(/queue name 'bad name'/);
    expect(() => resolveModuleOptions({} as never)).toThrow(/connection is required/);
    expect(() => resolveModuleOptions({ connection: {} as never, colour: 'red' } as never)).toThrow(
      /unknown option 'colour'/,
    );
    expect(() => resolveModuleOptions({ connection: {} as never, maxPayloadBytes: 0 })).toThrow(/maxPayloadBytes/);
    expect(() => resolveModuleOptions({ connection: {} as never, reaper: { intervalMs: 1 } })).toThrow(
      /reaper\.intervalMs/,
    );
    expect(() => resolveConsumerOptions({ activationQuietMs: 2_000 } as never)).toThrow(
      /consumer\.activationQuietMs is no longer an option: readers now start for claimed work/,
    );
    expect(() => resolveModuleOptions({ connection: {} as never, consumer: { enabled: 'yes' as never } })).toThrow(
      /consumer\.enabled must be true or false/,
    );
    expect(resolveModuleOptions({ connection: {} as never }).throughput).toEqual({
      enabled: true,
      flushIntervalMs: 5_000,
    });
    expect(() => resolveModuleOptions({ connection: {} as never, throughput: { flushIntervalMs: 10 } })).toThrow(
      /throughput\.flushIntervalMs/,
    );
    expect(() => resolveModuleOptions({ connection: {} as never, throughput: { interval: 10 } as never })).toThrow(
      /unknown option 'interval'/,
    );
    const defaults = resolveModuleOptions({ connection: {} as never });
    expect(defaults.enqueueBatching).toEqual({ enabled: true, maxBatchSize: 500, maxInFlight: 2, windowUs: 0 });
    expect(defaults.tracing).toEqual({ enabled: true, consumerSpan: 'child', claimSpans: false, reaperSpans: false });
    expect(() => resolveModuleOptions({ connection: {} as never, enqueueBatching: { windowUs: 5_000 } })).toThrow(
      /enqueueBatching\.windowUs/,
    );
    expect(() =>
      resolveModuleOptions({ connection: {} as never, tracing: { consumerSpan: 'parent' as never } }),
    ).toThrow("tracing.consumerSpan must be 'child' or 'link', got 'parent'");
  });
});
