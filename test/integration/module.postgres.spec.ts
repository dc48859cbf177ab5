import { Controller, Inject, Injectable, Module, Scope, type INestApplicationContext } from '@nestjs/common';
import pg from 'pg';
import { describe, expect, it } from 'vitest';
import {
  QueueHandler,
  QueueProducer,
  SqlQueueConfigError,
  SqlQueueLeaseLostError,
  SqlQueueModule,
  SqlQueueRateLimitedError,
  SqlQueueShutdownError,
  SqlQueueUnrecoverableError,
  SqlQueueValidationError,
  SqlQueueWaitTimeoutError,
  type JobContext,
  type QueueJobHandler,
  type QueueEventListener,
  type SqlQueueModuleOptions,
} from '../../lib/src/index.js';
import { MAX_RESULT_BYTES } from '../../lib/src/core/types.js';
import { PG_URL, sql } from '../helpers/databases.js';
import { PgProxy } from '../helpers/pg-proxy.js';
import { queueAppSuite } from '../helpers/queue-app.js';
import { deferred, waitFor } from '../helpers/wait-for.js';

const { schema, boot, forget } = queueAppSuite('module');
const connection = { dialect: 'postgres' as const, url: PG_URL, poolSize: 6 };

/** A statement on the test database, seen from outside the application. */
function query<R extends Record<string, unknown>>(text: string, params: unknown[] = []): Promise<R[]> {
  return sql<R>(PG_URL, text, params);
}

describe('SqlQueueModule: registration', () => {
  it('forRoot provides a working producer', async () => {
    const { app } = await boot({ schema });
    const producer = app.get(QueueProducer);
    const result = await producer.enqueue('reg.plain', { hello: 'world' });
    expect(result.created).toBe(true);
    expect(await producer.getJob(result.jobId)).toMatchObject({ state: 'ready', payload: { hello: 'world' } });
  });

  it('forRootAsync with useFactory and inject', async () => {
    @Injectable()
    class Settings {
      readonly url = PG_URL;
    }
    @Module({ providers: [Settings], exports: [Settings] })
    class SettingsModule {}
    const queueModule = SqlQueueModule.forRootAsync({
      imports: [SettingsModule],
      inject: [Settings],
      useFactory: (settings: Settings): SqlQueueModuleOptions => ({
        connection: { dialect: 'postgres', url: settings.url },
        schema,
      }),
    });
    const { app } = await boot({ schema, queueModule });
    expect((await app.get(QueueProducer).enqueue('reg.factory', {})).created).toBe(true);
  });

  it('forRootAsync with useClass and with useExisting', async () => {
    @Injectable()
    class QueueConfig {
      createSqlQueueOptions(): SqlQueueModuleOptions {
        return { connection, schema };
      }
    }
    const viaClass = await boot({ schema, queueModule: SqlQueueModule.forRootAsync({ useClass: QueueConfig }) });
    expect((await viaClass.app.get(QueueProducer).enqueue('reg.class', {})).created).toBe(true);

    @Module({ providers: [QueueConfig], exports: [QueueConfig] })
    class ConfigModule {}
    const viaExisting = await boot({
      schema,
      queueModule: SqlQueueModule.forRootAsync({ imports: [ConfigModule], useExisting: QueueConfig }),
    });
    expect((await viaExisting.app.get(QueueProducer).enqueue('reg.existing', {})).created).toBe(true);
  });

  it('isGlobal makes the producer injectable in feature modules without importing the queue module', async () => {
    @Injectable()
    class OrdersService {
      constructor(@Inject(QueueProducer) readonly producer: QueueProducer) {}
    }
    @Module({ providers: [OrdersService], exports: [OrdersService] })
    class OrdersModule {}
    const { app } = await boot({
      schema,
      queueModule: SqlQueueModule.forRoot({ connection, schema, isGlobal: true }),
      imports: [OrdersModule],
    });
    expect(app.get(OrdersService).producer).toBeInstanceOf(QueueProducer);
  });

  it('rejects invalid enqueue arguments before touching the database', async () => {
    const { app } = await boot({ schema });
    const producer = app.get(QueueProducer);
    const cyclic: Record<string, unknown> = {};
    cyclic.self = cyclic;
    await expect(producer.enqueue('bad queue', {})).rejects.toThrow(SqlQueueValidationError);
    await expect(producer.enqueue('q', cyclic)).rejects.toThrow(/not JSON-serializable/);
    await expect(producer.enqueue('q', undefined)).rejects.toThrow(/not JSON-serializable/);
    await expect(producer.enqueue('q', { big: 'x'.repeat(1024 * 1024) })).rejects.toThrow(/over the limit/);
    await expect(producer.enqueue('q', {}, { delayMs: -1 })).rejects.toThrow(/delayMs/);
    await expect(producer.enqueue('q', {}, { maxAttempts: 0 })).rejects.toThrow(/maxAttempts/);
    await expect(producer.enqueue('q', {}, { runAt: new Date('nope') })).rejects.toThrow(/runAt/);
    await expect(producer.enqueueMany('q', [{ payload: 1 }, { payload: 2, priority: 1.5 }])).rejects.toThrow(
      /item 1.*priority/,
    );
    // Unknown options are refused, not ignored (a 'delay' would otherwise run the job at once).
    await expect(producer.enqueue('q', {}, { delay: 5 } as never)).rejects.toThrow(
      /unknown option 'delay' \(did you mean 'delayMs'\?\)/,
    );
    await expect(producer.enqueueMany('q', [{ payload: 1, delay: 5 } as never])).rejects.toThrow(
      /item 0\): unknown option 'delay'/,
    );
    expect((await producer.stats('q')).ready).toBe(0);
  });
});

describe('SqlQueueModule: boot errors name the class and the problem', () => {
  it('two handlers for one queue', async () => {
    @QueueHandler('dup')
    class FirstHandler {
      async handle() {}
    }
    @QueueHandler('dup')
    class SecondHandler {
      async handle() {}
    }
    await expect(boot({ schema, providers: [FirstHandler, SecondHandler] })).rejects.toThrow(
      /queue 'dup' has two handlers, FirstHandler and SecondHandler/,
    );
  });

  it('a request-scoped handler', async () => {
    @QueueHandler('scoped')
    @Injectable({ scope: Scope.REQUEST })
    class ScopedHandler {
      async handle() {}
    }
    await expect(boot({ schema, providers: [ScopedHandler] })).rejects.toThrow(
      /ScopedHandler: handlers must be singleton/,
    );
  });

  it('a class without handle()', async () => {
    @QueueHandler('nohandle')
    class NoHandle {}
    await expect(boot({ schema, providers: [NoHandle] })).rejects.toThrow(/NoHandle: the class has no handle/);
  });

  it('invalid handler options', async () => {
    // A single option out of range fails when the class is defined (nest-boot-checks-offline).
    @QueueHandler('minmax', { minReaders: 5, maxReaders: 2 })
    class MinOverMax {
      async handle() {}
    }
    await expect(boot({ schema, providers: [MinOverMax] })).rejects.toThrow(/MinOverMax: minReaders \(5\) is greater/);
  });

  it('invalid module options and a missing ScheduleModule', async () => {
    await expect(boot({ schema: 'bad schema' })).rejects.toThrow(SqlQueueConfigError);
    await expect(boot({ schema, module: { migrations: 'sometimes' as never } })).rejects.toThrow(/migrations must be/);
    await expect(boot({ schema, module: { consumer: { maxPollMs: 10, minPollMs: 100 } } })).rejects.toThrow(
      /consumer\.maxPollMs must be an integer from 100/,
    );
    await expect(boot({ schema, withSchedule: false })).rejects.toThrow(/import ScheduleModule\.forRoot\(\)/);
    const ok = await boot({
      schema,
      withSchedule: false,
      module: { reaper: { enabled: false }, retention: { enabled: false } },
    });
    expect(ok.app.get(QueueProducer)).toBeDefined();
  });
});

describe('SqlQueueModule: a handler that meets an outside limit (issue 24)', () => {
  it('SqlQueueRateLimitedError and context.rateLimited() postpone the job without counting an attempt; it runs again after the wait', async () => {
    const runs: { n: number; attempt: number; at: number }[] = [];
    @QueueHandler('limited', { maxAttempts: 1 })
    class LimitedHandler implements QueueJobHandler<{ n: number }, object> {
      async handle(payload: { n: number }, context: JobContext) {
        runs.push({ n: payload.n, attempt: context.attempt, at: Date.now() });
        const first = runs.filter((r) => r.n === payload.n).length === 1;
        if (first && payload.n === 1) throw new SqlQueueRateLimitedError(400, 'HTTP 429 from the partner API');
        if (first && payload.n === 2) {
          context.rateLimited(400);
          return { ignored: true }; // the postponement wins over the return value
        }
        expect(() => context.rateLimited(-1)).toThrow(/retryAfterMs must be an integer from 0/);
        return { n: payload.n };
      }
    }
    const events: { jobId: string; delayMs: number }[] = [];
    const { app } = await boot({
      schema,
      providers: [LimitedHandler],
      module: { listeners: [{ rateLimited: (e) => events.push(e) }] },
    });
    const producer = app.get(QueueProducer);
    const [one, two] = await Promise.all([
      producer.enqueue('limited', { n: 1 }),
      producer.enqueue('limited', { n: 2 }),
    ]);
    for (const { jobId } of [one, two]) {
      // maxAttempts 1: a counted attempt would have made the job dead.
      const job = await producer.waitFor(jobId, { timeoutMs: 10_000 });
      expect(job).toMatchObject({ state: 'done', attempts: 1 });
      expect((await producer.getAttempts(jobId)).map((a) => a.outcome)).toEqual(['completed']);
    }
    for (const n of [1, 2]) {
      const [first, second] = runs.filter((r) => r.n === n);
      expect([first!.attempt, second!.attempt]).toEqual([1, 1]);
      expect(second!.at - first!.at).toBeGreaterThanOrEqual(350);
    }
    expect(events.map((e) => e.delayMs)).toEqual([400, 400]);
    expect(() => new SqlQueueRateLimitedError(1.5)).toThrow(/retryAfterMs must be an integer/);
  });
});

describe('SqlQueueModule: results and waitFor (issue 23)', () => {
  it("stores a handler's return value with its completion; waitFor resolves with it; a result over the limit fails the job for good", async () => {
    @QueueHandler('results', { maxAttempts: 3 })
    class ResultHandler implements QueueJobHandler<{ n: number; big?: boolean }, { doubled: number; note?: string }> {
      async handle(payload: { n: number; big?: boolean }) {
        await new Promise((resolve) => setTimeout(resolve, 100));
        return payload.big ? { doubled: 0, note: 'x'.repeat(MAX_RESULT_BYTES) } : { doubled: payload.n * 2 };
      }
    }
    const { app } = await boot({ schema, providers: [ResultHandler] });
    const producer = app.get(QueueProducer);
    const { jobId } = await producer.enqueue('results', { n: 21 });
    const finished = await producer.waitFor(jobId, { timeoutMs: 10_000 });
    expect(finished).toMatchObject({ id: jobId, state: 'done', result: { doubled: 42 } });
    expect((await producer.getJob(jobId))!.result).toEqual({ doubled: 42 });

    const { jobId: big } = await producer.enqueue('results', { n: 1, big: true });
    const failed = await producer.waitFor(big, { timeoutMs: 10_000 });
    expect(failed).toMatchObject({ state: 'dead', result: null, attempts: 1 });
    expect(failed.lastError).toMatch(/over the limit of 1048576 \(MAX_RESULT_BYTES\)/);

    await expect(producer.waitFor('999999999')).rejects.toThrow(/waitFor: no job 999999999/);
    await expect(producer.waitFor(jobId, { timeout: 5 } as never)).rejects.toThrow(/unknown option 'timeout'/);
  });

  it('progress: visible in getJob() while the handler runs, written at most once a second, the last value by the completion; bad values refused', async () => {
    const proxy = await PgProxy.start(PG_URL);
    let running: INestApplicationContext | undefined;
    try {
      const refused: unknown[] = [];
      @QueueHandler('progressing')
      class ProgressHandler {
        async handle(_payload: unknown, ctx: JobContext) {
          for (const bad of [-1, 101, Number.NaN, 'half', null, { big: 'x'.repeat(5000) }]) {
            try {
              ctx.progress(bad as never);
            } catch (error) {
              refused.push(error);
            }
          }
          for (let step = 1; step <= 300; step++) {
            ctx.progress({ step, of: 300 });
            await new Promise((resolve) => setTimeout(resolve, 7));
          }
          ctx.progress(100);
        }
      }
      const { app } = await boot({
        schema,
        providers: [ProgressHandler],
        module: { connection: { dialect: 'postgres', url: proxy.urlFor(PG_URL), poolSize: 6 } },
      });
      running = app;
      const producer = app.get(QueueProducer);
      const { jobId } = await producer.enqueue('progressing', {});
      const from = Date.now();
      const midway = await waitFor(
        () => producer.getJob(jobId),
        (job) => typeof (job?.progress as { step?: number } | null)?.step === 'number',
        { what: 'a progress report visible before the completion', timeoutMs: 10_000 },
      );
      expect(midway!.state).toBe('leased');
      const done = await producer.waitFor(jobId, { timeoutMs: 20_000 });
      const tookMs = Date.now() - from;
      expect(done).toMatchObject({ state: 'done', progress: 100 });
      // 301 reports in about 2.5 s: one heartbeat a second at most (plus the lease's own).
      const heartbeats = proxy.count('_heartbeat', from);
      expect(heartbeats).toBeGreaterThanOrEqual(1);
      expect(heartbeats).toBeLessThanOrEqual(Math.ceil(tookMs / 1_000) + 2);
      expect(refused).toHaveLength(6);
      expect(refused.every((e) => e instanceof SqlQueueValidationError)).toBe(true);
      expect(String(refused[5])).toMatch(/over the limit of 4096/);
    } finally {
      // Closed here, before its proxy: the application's connections go through it.
      if (running) {
        forget(running);
        await running.close();
      }
      await proxy.close();
    }
  });

  it('waitFor gives up after timeoutMs with the job still waiting, naming its state', async () => {
    const { app } = await boot({ schema, module: { consumer: { enabled: false } } });
    const producer = app.get(QueueProducer);
    const { jobId } = await producer.enqueue('results.nobody', { n: 1 });
    const startedAt = Date.now();
    await expect(producer.waitFor(jobId, { timeoutMs: 200 })).rejects.toThrow(SqlQueueWaitTimeoutError);
    expect(Date.now() - startedAt).toBeGreaterThanOrEqual(190);
    await expect(producer.waitFor(jobId, { timeoutMs: 50 })).rejects.toThrow(/is still ready after 50 ms/);
  });
});

describe('SqlQueueModule: option precedence and misuse', () => {
  it('stores the handler maxAttempts over the module queues entry, as the consumer applies it', async () => {
    @QueueHandler('prec', { maxAttempts: 7 })
    class PrecedenceHandler {
      async handle() {
        await new Promise(() => undefined);
      }
    }
    const { app } = await boot({
      schema,
      providers: [PrecedenceHandler],
      module: { queues: { prec: { maxAttempts: 2 } }, consumer: { enabled: false } },
    });
    const { jobId } = await app.get(QueueProducer).enqueue('prec', {});
    expect((await app.get(QueueProducer).getJob(jobId))!.maxAttempts).toBe(7);
  });

  it('refuses a second SqlQueueModule instance at boot, naming the fix', async () => {
    @Module({ imports: [SqlQueueModule.forRoot({ connection, schema })] })
    class FeatureWithItsOwnQueue {}
    await expect(boot({ schema, imports: [FeatureWithItsOwnQueue] })).rejects.toThrow(
      /imported more than once in this application: import it once/,
    );
  });

  it('rejects a nonsensical extendLease() and keeps the lease', async () => {
    const errors: unknown[] = [];
    const done = deferred<void>();
    @QueueHandler('extend')
    class ExtendingHandler {
      async handle(_payload: unknown, ctx: JobContext) {
        for (const ms of [0, -5, 1.5, Number.NaN]) await ctx.extendLease(ms).catch((e: unknown) => errors.push(e));
        await ctx.extendLease(120_000);
        done.resolve();
      }
    }
    const { app } = await boot({ schema, providers: [ExtendingHandler] });
    const { jobId } = await app.get(QueueProducer).enqueue('extend', {});
    await done.promise;
    expect(errors).toHaveLength(4);
    expect(errors.every((e) => e instanceof SqlQueueValidationError)).toBe(true);
    await waitFor(
      () => app.get(QueueProducer).getJob(jobId),
      (job) => job?.state === 'done',
    );
  });

  it('does not wake readers for a job enqueued in a transaction that has not committed', async () => {
    const claims: number[] = [];
    @QueueHandler('txwake', { minReaders: 1, maxReaders: 1, minPollMs: 5_000, maxPollMs: 5_000 })
    class TxWakeHandler {
      async handle() {}
    }
    const { app } = await boot({
      schema,
      providers: [TxWakeHandler],
      module: { listeners: [{ emptyClaim: () => claims.push(Date.now()), claimed: () => claims.push(Date.now()) }] },
    });
    await waitFor(
      () => claims.length,
      (n) => n >= 1,
      { what: 'the first (empty) claim' },
    );
    const before = claims.length;
    const client = new pg.Client({ connectionString: PG_URL });
    await client.connect();
    try {
      await client.query('BEGIN');
      const { jobId } = await app.get(QueueProducer).enqueue('txwake', {}, { transaction: client });
      await new Promise((resolve) => setTimeout(resolve, 200));
      // No wake-up while the job is invisible: no claim was spent on it.
      expect(claims.length).toBe(before);
      await client.query('COMMIT');
      app.get(QueueProducer).wake('txwake');
      await waitFor(
        () => app.get(QueueProducer).getJob(jobId),
        (job) => job?.state === 'done',
        { timeoutMs: 3_000 },
      );
    } finally {
      await client.end();
    }
  });
});

describe('SqlQueueModule: running jobs', () => {
  it('1,000 jobs enqueued from a controller each run exactly once', async () => {
    const runs = new Map<number, number>();
    @QueueHandler('many', { maxReaders: 8, minReaders: 2 })
    class CountingHandler {
      async handle(payload: { n: number }) {
        runs.set(payload.n, (runs.get(payload.n) ?? 0) + 1);
      }
    }
    @Controller()
    class OrdersController {
      constructor(@Inject(QueueProducer) private readonly producer: QueueProducer) {}
      place(n: number) {
        return this.producer.enqueue('many', { n }, { idempotencyKey: `order-${n}` });
      }
    }
    const { app } = await boot({ schema, providers: [CountingHandler, OrdersController] });
    const controller = app.get(OrdersController);
    const results = await Promise.all(Array.from({ length: 1000 }, (_, n) => controller.place(n)));
    expect(results.every((r) => r.created)).toBe(true);
    await waitFor(
      () => runs.size,
      (size) => size === 1000,
      { timeoutMs: 30_000, what: '1000 distinct jobs to run' },
    );
    const producer = app.get(QueueProducer);
    await waitFor(
      () => producer.stats('many'),
      (s) => s.ready === 0 && s.leased === 0,
      { what: 'all acked' },
    );
    expect([...runs.values()].every((count) => count === 1)).toBe(true);
    const [done] = await query<{ n: number }>(
      `SELECT count(*)::int AS n FROM "${schema}".jobs WHERE queue = 'many' AND state = 'done'`,
    );
    expect(done!.n).toBe(1000);
  });

  it('a handler that fails twice then succeeds ends done with three attempts recorded', async () => {
    let calls = 0;
    @QueueHandler('flaky', { backoff: { type: 'fixed', delayMs: 20 } })
    class FlakyHandler {
      async handle(_payload: unknown, ctx: JobContext) {
        calls++;
        if (ctx.attempt < 3) throw new Error(`transient failure ${ctx.attempt}`);
      }
    }
    const { app } = await boot({ schema, providers: [FlakyHandler] });
    const producer = app.get(QueueProducer);
    const { jobId } = await producer.enqueue('flaky', { x: 1 });
    await waitFor(
      () => producer.getJob(jobId),
      (job) => job?.state === 'done',
      { what: 'the flaky job to finish' },
    );
    const attempts = await producer.getAttempts(jobId);
    expect(attempts.map((a) => [a.attempt, a.outcome, a.error])).toEqual([
      [1, 'failed', 'transient failure 1'],
      [2, 'failed', 'transient failure 2'],
      [3, 'completed', null],
    ]);
    expect(attempts[0]!.stack).toMatch(/transient failure 1/);
    expect(calls).toBe(3);
  });

  it('a handler that always fails ends dead with its last error; unrecoverable errors go dead at once', async () => {
    @QueueHandler('doomed', { maxAttempts: 3, backoff: { type: 'exponential', baseMs: 5, maxMs: 20 } })
    class DoomedHandler {
      async handle(payload: { kind: string }, ctx: JobContext) {
        if (payload.kind === 'poison') throw new SqlQueueUnrecoverableError('payload cannot be parsed');
        throw new Error(`smtp refused on attempt ${ctx.attempt}`);
      }
    }
    const { app, logger } = await boot({ schema, providers: [DoomedHandler] });
    const producer = app.get(QueueProducer);
    const doomed = await producer.enqueue('doomed', { kind: 'retry' });
    const poison = await producer.enqueue('doomed', { kind: 'poison' });
    await waitFor(
      () => producer.stats('doomed'),
      (s) => s.dead === 2,
      { what: 'both jobs dead' },
    );
    expect(await producer.getJob(doomed.jobId)).toMatchObject({
      state: 'dead',
      attempts: 3,
      maxAttempts: 3,
      lastError: 'smtp refused on attempt 3',
    });
    expect(await producer.getJob(poison.jobId)).toMatchObject({ state: 'dead', attempts: 1 });
    expect(logger.matching(new RegExp(`job ${doomed.jobId} in queue 'doomed' is dead after attempt 3/3`))).toHaveLength(
      1,
    );
    const page = await producer.listDead('doomed');
    expect(page.jobs.map((j) => j.id).sort()).toEqual([doomed.jobId, poison.jobId].sort());
  });

  it('a lease stolen mid-run aborts ctx.signal and the stale completion is refused', async () => {
    let signalReason: unknown = null;
    const started = deferred<string>();
    @QueueHandler('stolen', { leaseMs: 600 })
    class SlowHandler {
      async handle(_payload: unknown, ctx: JobContext) {
        started.resolve(ctx.jobId);
        await new Promise<void>((resolve) => ctx.signal.addEventListener('abort', () => resolve(), { once: true }));
        signalReason = ctx.signal.reason;
        // Returns normally: the engine must still refuse to count this as success.
      }
    }
    const lost: unknown[] = [];
    const listener: QueueEventListener = { lostOwnership: (event) => lost.push(event) };
    const { app, logger } = await boot({
      schema,
      providers: [SlowHandler],
      module: { listeners: [listener], reaper: { enabled: false } },
    });
    const producer = app.get(QueueProducer);
    const { jobId } = await producer.enqueue('stolen', {});
    await started.promise;
    // Another worker takes the job over: its lease is expired and it is claimed with a new token.
    const thiefToken = '00000000-0000-4000-8000-000000000001';
    await query(
      `UPDATE "${schema}".jobs SET claim_token = $2, worker_id = 'thief', lease_until = now() + interval '1 hour' WHERE id = $1`,
      [jobId, thiefToken],
    );
    await waitFor(() => signalReason, Boolean, { what: 'the handler signal to abort' });
    expect(signalReason).toBeInstanceOf(SqlQueueLeaseLostError);
    await waitFor(
      () => lost.length,
      (n) => n >= 2,
      { what: 'heartbeat and completion to report lost ownership' },
    );
    expect(lost).toEqual([
      expect.objectContaining({ jobId, during: 'heartbeat', outcome: 'lost' }),
      expect.objectContaining({ jobId, during: 'complete', outcome: 'lost' }),
    ]);
    expect(logger.matching(new RegExp(`job ${jobId} in queue 'stolen': completion refused`))).toHaveLength(1);
    // The thief's ownership is untouched.
    expect(await producer.getJob(jobId)).toMatchObject({ state: 'leased', claimToken: thiefToken, workerId: 'thief' });
  });

  it('maxDurationMs aborts the handler, fails the attempt, and refuses its late completion', async () => {
    let reason: unknown;
    @QueueHandler('slowpoke', { leaseMs: 400, maxDurationMs: 300, maxAttempts: 1 })
    class SlowpokeHandler {
      async handle(_payload: unknown, ctx: JobContext) {
        await new Promise<void>((resolve) => ctx.signal.addEventListener('abort', () => resolve(), { once: true }));
        reason = ctx.signal.reason;
      }
    }
    const { app, logger } = await boot({ schema, providers: [SlowpokeHandler] });
    const producer = app.get(QueueProducer);
    const { jobId } = await producer.enqueue('slowpoke', {});
    await waitFor(
      () => producer.getJob(jobId),
      (job) => job?.state === 'dead',
      { what: 'the slow job to be failed' },
    );
    expect((reason as Error).name).toBe('SqlQueueJobTimeoutError');
    expect((await producer.getJob(jobId))!.lastError).toMatch(/exceeded maxDurationMs=300/);
    await waitFor(
      () => logger.matching(new RegExp(`job ${jobId} .*completion refused`)),
      (l) => l.length === 1,
    );
  });

  it('shutdown lets running jobs finish, gives back the rest, and loses nothing', async () => {
    const finished: number[] = [];
    const startedJobs: number[] = [];
    @QueueHandler('drain', { minReaders: 3, maxReaders: 3, prefetch: 3 })
    class DrainHandler {
      async handle(payload: { n: number }) {
        startedJobs.push(payload.n);
        await new Promise((resolve) => setTimeout(resolve, 300));
        finished.push(payload.n);
      }
    }
    const { app } = await boot({
      schema,
      providers: [DrainHandler],
      module: { consumer: { shutdownTimeoutMs: 5_000 } },
    });
    const producer = app.get(QueueProducer);
    await producer.enqueueMany(
      'drain',
      Array.from({ length: 12 }, (_, n) => ({ payload: { n } })),
    );
    await waitFor(
      () => startedJobs.length,
      (n) => n >= 3,
      { what: 'three jobs to start' },
    );
    const runningAtClose = startedJobs.length;
    await app.close();
    forget(app);
    expect(finished.length).toBe(runningAtClose);
    const rows = await query<{ state: string; n: number; attempts_sum: number }>(
      `SELECT state, count(*)::int AS n, sum(attempts)::int AS attempts_sum FROM "${schema}".jobs WHERE queue = 'drain' GROUP BY state ORDER BY state`,
    );
    const byState = Object.fromEntries(rows.map((r) => [r.state, r]));
    expect(byState.leased).toBeUndefined();
    expect(byState.done!.n).toBe(runningAtClose);
    expect(byState.ready!.n).toBe(12 - runningAtClose);
    // Prefetched jobs that never started were released without spending an attempt.
    expect(byState.ready!.attempts_sum).toBe(0);

    // A new instance finishes the rest; nothing ran twice.
    const second = await boot({ schema, providers: [DrainHandler] });
    await waitFor(
      () => second.app.get(QueueProducer).stats('drain'),
      (s) => s.ready === 0 && s.leased === 0,
      {
        what: 'the second instance to drain the queue',
      },
    );
    expect(new Set(finished).size).toBe(12);
    expect(finished).toHaveLength(12);
  });

  it('shutdown past its timeout aborts handlers and gives their jobs back without spending an attempt', async () => {
    let reason: unknown;
    const started = deferred<void>();
    @QueueHandler('stubborn')
    class StubbornHandler {
      async handle(_payload: unknown, ctx: JobContext) {
        started.resolve();
        await new Promise<void>((_, reject) =>
          ctx.signal.addEventListener('abort', () => reject((reason = ctx.signal.reason)), { once: true }),
        );
      }
    }
    const { app } = await boot({
      schema,
      providers: [StubbornHandler],
      module: { consumer: { shutdownTimeoutMs: 200 } },
    });
    const { jobId } = await app.get(QueueProducer).enqueue('stubborn', {});
    await started.promise;
    await app.close();
    forget(app);
    expect(reason).toBeInstanceOf(SqlQueueShutdownError);
    const [row] = await query<{ state: string; attempts: number }>(
      `SELECT state, attempts FROM "${schema}".jobs WHERE id = $1`,
      [jobId],
    );
    expect(row).toEqual({ state: 'ready', attempts: 0 });
  });

  it('idle readers claim no faster than maxPollMs allows', async () => {
    let claims = 0;
    const listener: QueueEventListener = { emptyClaim: () => claims++, claimed: () => claims++ };
    @QueueHandler('idle', { minReaders: 1, maxReaders: 1, minPollMs: 20, maxPollMs: 200 })
    class IdleHandler {
      async handle() {}
    }
    await boot({ schema, providers: [IdleHandler], module: { listeners: [listener] } });
    const idleMs = 2_000;
    const startedAt = Date.now();
    await new Promise((resolve) => setTimeout(resolve, idleMs));
    const elapsed = Date.now() - startedAt;
    // Pauses double from 20 ms to the 200 ms cap (20+40+80+160 = 300 ms of ramp), then one claim per ≥200 ms.
    const bound = 5 + Math.ceil((elapsed - 300) / 200) + 1;
    expect(claims).toBeGreaterThan(3);
    expect(claims).toBeLessThanOrEqual(bound);
  });

  it('a local enqueue wakes an idle reader at once instead of after its pause', async () => {
    let emptyClaims = 0;
    const listener: QueueEventListener = { emptyClaim: (e) => e.queue === 'sleepy' && emptyClaims++ };
    // Polling alone would find the job only after 60 s; the wait below gives up long before that.
    @QueueHandler('sleepy', { minReaders: 1, maxReaders: 1, minPollMs: 60_000, maxPollMs: 60_000 })
    class SleepyHandler {
      async handle() {}
    }
    // Without NOTIFY, only the in-process path can wake the reader.
    const { app } = await boot({
      schema,
      providers: [SleepyHandler],
      module: { listeners: [listener], wakeups: { enabled: false } },
    });
    await waitFor(
      () => emptyClaims,
      (n) => n >= 1,
      { what: 'the first empty claim, which starts the long pause' },
    );
    const producer = app.get(QueueProducer);
    const { jobId } = await producer.enqueue('sleepy', {});
    await waitFor(
      () => producer.getJob(jobId),
      (job) => job?.state === 'done',
      { timeoutMs: 10_000, intervalMs: 5, what: 'the woken reader to run the job' },
    );
  });

  it('grows readers while work waits and shrinks them once claims come back empty', async () => {
    const readerCounts: number[] = [];
    const listener: QueueEventListener = {
      readersChanged: (e) => e.queue === 'elastic' && readerCounts.push(e.readers),
    };
    let concurrent = 0;
    let peak = 0;
    @QueueHandler('elastic', { minReaders: 1, maxReaders: 4 })
    class ElasticHandler {
      async handle() {
        peak = Math.max(peak, ++concurrent);
        await new Promise((resolve) => setTimeout(resolve, 50));
        concurrent--;
      }
    }
    const { app } = await boot({
      schema,
      providers: [ElasticHandler],
      module: { listeners: [listener] },
    });
    const producer = app.get(QueueProducer);
    await producer.enqueueMany(
      'elastic',
      Array.from({ length: 80 }, (_, n) => ({ payload: { n } })),
    );
    await waitFor(
      () => producer.stats('elastic'),
      (s) => s.ready === 0 && s.leased === 0,
      { timeoutMs: 20_000 },
    );
    expect(peak).toBe(4);
    expect(Math.max(...readerCounts)).toBe(4);
    await waitFor(
      () => readerCounts.at(-1),
      (n) => n === 1,
      { what: 'readers to retire back to the minimum' },
    );
  });
});
