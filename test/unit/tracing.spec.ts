import { describe, expect, it, vi } from 'vitest';
import { SqlQueueConfigError } from '../../lib/src/core/errors.js';
import { QueueProducerCore } from '../../lib/src/core/producer/producer.js';
import { QueueConsumer } from '../../lib/src/core/consumer/queue-consumer.js';
import type { QueueStore } from '../../lib/src/core/queue-store.js';
import {
  decodeTraceCarrier,
  encodeTraceCarrier,
  MAX_TRACE_CONTEXT_LENGTH,
  NO_TRACING,
  type QueueTracer,
} from '../../lib/src/core/tracing.js';
import type { ClaimedJob, EnqueueResult, NewJob, ReapedJob } from '../../lib/src/core/types.js';
import { prepareJob, withTraceContext } from '../../lib/src/core/producer/job-validation.js';
import { WakeBus } from '../../lib/src/core/wake.js';
import { loadQueueTracer } from '../../lib/src/tracing/tracing.loader.js';
import { claimedJob, engineDeps, queueOptions, stopOnFakeClock, TokenStore } from '../helpers/engine.js';
import { FakeClock } from '../helpers/fake-clock.js';

const TRACEPARENT = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';

/** Records what the engine hands to tracing, and which jobs' handlers run inside their span right now. */
class RecordingTracer implements QueueTracer {
  readonly events: string[] = [];
  readonly inSpan = new Set<string>();

  async send<T extends EnqueueResult | readonly EnqueueResult[]>(
    queue: string,
    batchSize: number | null,
    send: (traceContext: string | null) => Promise<T>,
  ): Promise<T> {
    this.events.push(`send ${queue} ${batchSize}`);
    return send('{"traceparent":"x"}');
  }

  async process<T>(job: ClaimedJob, run: () => Promise<T>): Promise<T> {
    this.events.push(`process ${job.id} attempt ${job.attempt} context ${job.traceContext ?? 'none'}`);
    this.inSpan.add(job.id);
    try {
      return await run();
    } catch (error) {
      this.events.push(`failed ${job.id}: ${(error as Error).message}`);
      throw error;
    } finally {
      this.inSpan.delete(job.id);
    }
  }

  async claim(queue: string, limit: number, claim: () => Promise<ClaimedJob[]>): Promise<ClaimedJob[]> {
    const claimed = await claim();
    if (claimed.length > 0) this.events.push(`claim ${queue} limit ${limit}: ${claimed.length}`);
    return claimed;
  }

  async reap(reap: () => Promise<ReapedJob[]>): Promise<ReapedJob[]> {
    return reap();
  }
}

describe('the consumer runs every attempt through the tracer', () => {
  it("gives each handler run its job (with the stored trace context) and sees the handler's outcome", async () => {
    const clock = new FakeClock();
    const store = new TokenStore();
    const fail = vi.spyOn(store, 'fail');
    const complete = vi.spyOn(store, 'complete');
    store.tokens.set('1', 't1').set('2', 't2').set('3', 't3');
    store.queued.push([
      claimedJob('1', 't1', { payload: { ok: true }, traceContext: `{"traceparent":"${TRACEPARENT}"}` }),
      claimedJob('2', 't2', { payload: { ok: false }, attempt: 2 }),
      claimedJob('3', 't3', { payload: { sync: true } }),
    ]);
    const tracer = new RecordingTracer();
    const seenInSpan: string[] = [];
    const handler = (payload: unknown, context: { jobId: string }): Promise<void> => {
      if (tracer.inSpan.has(context.jobId)) seenInSpan.push(context.jobId);
      const { ok, sync } = payload as { ok?: boolean; sync?: boolean };
      // A handler that throws before returning a promise is still the span's failure.
      if (sync) throw new Error('thrown synchronously');
      return ok ? Promise.resolve() : Promise.reject(new Error('handler failed'));
    };
    const consumer = new QueueConsumer(
      engineDeps(store, clock, { tracer }),
      queueOptions({ minReaders: 3, maxReaders: 3 }),
      handler,
    );
    consumer.start();
    await clock.advance(100);
    await stopOnFakeClock(consumer, clock);

    expect(seenInSpan.sort()).toEqual(['1', '2', '3']);
    expect(tracer.events).toEqual(
      expect.arrayContaining([
        'claim q limit 3: 3',
        `process 1 attempt 1 context {"traceparent":"${TRACEPARENT}"}`,
        'process 2 attempt 2 context none',
        'failed 2: handler failed',
        'failed 3: thrown synchronously',
      ]),
    );
    expect(tracer.events.filter((e) => e.startsWith('failed 1'))).toEqual([]);
    // The outcome the tracer saw is the one recorded: 1 completed, 2 and 3 failed.
    expect(complete.mock.calls.flat(2).map((item) => item.id)).toEqual(['1']);
    expect(
      fail.mock.calls
        .flat(2)
        .map((item) => item.id)
        .sort(),
    ).toEqual(['2', '3']);
  });
});

describe('the producer sends through the tracer', () => {
  /** A store that keeps what each enqueue statement received. */
  function recordingStore() {
    const statements: NewJob[][] = [];
    const store = {
      async enqueue(jobs: readonly NewJob[]) {
        statements.push([...jobs]);
        return jobs.map((_, i) => ({ jobId: String(statements.length * 100 + i), created: true }));
      },
    };
    return { statements, store: store as unknown as QueueStore };
  }
  const producer = (store: QueueStore, tracer: QueueTracer, batching: boolean) =>
    new QueueProducerCore(
      store,
      {
        maxPayloadBytes: 1024,
        maxAttemptsFor: () => 3,
        tracer,
        enqueueBatching: { enabled: batching, maxBatchSize: 10, maxInFlight: 1, windowUs: 0 },
      },
      new WakeBus(),
      null,
    );

  for (const batching of [false, true]) {
    it(`enqueue${batching ? ' (batched)' : ''}: one send per call, and the job stores its context`, async () => {
      const { statements, store } = recordingStore();
      const tracer = new RecordingTracer();
      expect(await producer(store, tracer, batching).enqueue('orders', { n: 1 })).toEqual({
        jobId: '100',
        created: true,
      });
      expect(tracer.events).toEqual(['send orders null']);
      expect(statements.flat().map((job) => job.traceContext)).toEqual(['{"traceparent":"x"}']);
    });
  }

  it("batched enqueues from different calls share a statement, each job keeping its own call's context", async () => {
    const { statements, store } = recordingStore();
    let calls = 0;
    const perCall: QueueTracer = {
      ...NO_TRACING,
      send: (_queue, _size, send) => send(`{"traceparent":"call-${++calls}"}`),
    };
    const batched = producer(store, perCall, true);
    await Promise.all([batched.enqueue('orders', 1), batched.enqueue('orders', 2), batched.enqueue('orders', 3)]);
    expect(statements).toHaveLength(1);
    expect(statements[0]!.map((job) => [job.payload, job.traceContext])).toEqual([
      ['1', '{"traceparent":"call-1"}'],
      ['2', '{"traceparent":"call-2"}'],
      ['3', '{"traceparent":"call-3"}'],
    ]);
  });

  it('enqueueMany: one send with the batch size, every job with its context', async () => {
    const { statements, store } = recordingStore();
    const tracer = new RecordingTracer();
    await producer(store, tracer, true).enqueueMany('orders', [{ payload: 1 }, { payload: 2 }, { payload: 3 }]);
    expect(tracer.events).toEqual(['send orders 3']);
    expect(statements.flat().map((job) => job.traceContext)).toEqual(Array(3).fill('{"traceparent":"x"}'));
  });

  it('no send for a call refused by validation, nor for an empty enqueueMany', async () => {
    const { statements, store } = recordingStore();
    const tracer = new RecordingTracer();
    const refused = producer(store, tracer, false);
    await expect(refused.enqueue('orders', 1, { priority: 1.5 })).rejects.toThrow('priority');
    await expect(refused.enqueueMany('orders', [{ payload: 1 }, { payload: 2, delayMs: -1 }])).rejects.toThrow(
      'item 1',
    );
    expect(await refused.enqueueMany('orders', [])).toEqual([]);
    expect(tracer.events).toEqual([]);
    expect(statements).toEqual([]);
  });

  it('without a tracer, jobs carry no trace context', async () => {
    const { statements, store } = recordingStore();
    await new QueueProducerCore(store, { maxPayloadBytes: 1024, maxAttemptsFor: () => 3 }, new WakeBus(), null).enqueue(
      'orders',
      1,
    );
    expect('traceContext' in statements[0]![0]!).toBe(false);
  });
});

describe('trace context as stored text', () => {
  it('keeps a propagator carrier as small JSON and reads it back', () => {
    const carrier = { traceparent: TRACEPARENT, tracestate: 'congo=t61rcWkgMzE' };
    const text = encodeTraceCarrier(carrier);
    expect(text).toBe(`{"traceparent":"${TRACEPARENT}","tracestate":"congo=t61rcWkgMzE"}`);
    expect(decodeTraceCarrier(text)).toEqual(carrier);
  });

  it('stores nothing for an empty carrier (no SDK: the API injects nothing)', () => {
    expect(encodeTraceCarrier({})).toBeNull();
  });

  it('keeps only traceparent when the carrier is too long, and drops what is not header text', () => {
    const long = { traceparent: TRACEPARENT, baggage: `k=${'v'.repeat(MAX_TRACE_CONTEXT_LENGTH)}` };
    expect(encodeTraceCarrier(long)).toBe(`{"traceparent":"${TRACEPARENT}"}`);
    expect(encodeTraceCarrier({ baggage: `k=${'v'.repeat(MAX_TRACE_CONTEXT_LENGTH)}` })).toBeNull();
    expect(encodeTraceCarrier({ traceparent: TRACEPARENT, tracestate: 'é=1' })).toBe(
      `{"traceparent":"${TRACEPARENT}"}`,
    );
  });

  it('reads text that is no carrier as none, so a job always runs', () => {
    for (const text of [null, undefined, '', 'not json', '[1,2]', '"x"', '{"traceparent":7}']) {
      expect(decodeTraceCarrier(text)).toEqual({});
    }
  });

  it("withTraceContext gives prepared jobs the call's context, leaves them without one for null or a malformed one", () => {
    const limits = { maxPayloadBytes: 100, defaultMaxAttempts: 3 };
    const text = `{"traceparent":"${TRACEPARENT}"}`;
    const jobs = [prepareJob('q', {}, {}, limits), prepareJob('q', {}, {}, limits)];
    withTraceContext(jobs, null);
    expect(jobs.some((job) => 'traceContext' in job)).toBe(false);
    withTraceContext(jobs, text);
    expect(jobs.map((job) => job.traceContext)).toEqual([text, text]);
    // A context the tracer should never have produced is dropped, never an enqueue failure.
    const fresh = [prepareJob('q', {}, {}, limits)];
    withTraceContext(fresh, 'x'.repeat(MAX_TRACE_CONTEXT_LENGTH + 1));
    withTraceContext(fresh, '{"a":"\u0001"}');
    withTraceContext(fresh, '');
    expect('traceContext' in fresh[0]!).toBe(false);
  });
});

describe('loading the tracer at boot', () => {
  const settings = { enabled: true, consumerSpan: 'link' as const, claimSpans: true, reaperSpans: false };
  const debug = () => ({
    lines: [] as string[],
    debug(line: string) {
      this.lines.push(line);
    },
  });

  it('is NO_TRACING when tracing is off, without loading anything', async () => {
    const load = vi.fn();
    expect(await loadQueueTracer({ ...settings, enabled: false }, 'w', debug(), load)).toBe(NO_TRACING);
    expect(load).not.toHaveBeenCalled();
  });

  it('is NO_TRACING when @opentelemetry/api is not installed, and says so at debug level', async () => {
    const missing = Object.assign(
      new Error("Cannot find package '@opentelemetry/api' imported from /app/node_modules/x/tracing/otel.tracer.js"),
      { code: 'ERR_MODULE_NOT_FOUND' },
    );
    const logger = debug();
    expect(await loadQueueTracer(settings, 'w', logger, () => Promise.reject(missing))).toBe(NO_TRACING);
    expect(logger.lines).toEqual(['tracing: @opentelemetry/api is not installed, so jobs carry no trace context']);
  });

  it('fails the boot for any other loading error, saying what to do (a broken install of the API)', async () => {
    const broken = Object.assign(
      new Error("Cannot find module '/app/node_modules/@opentelemetry/api/build/esm/index.js' imported from /app/x.js"),
      { code: 'ERR_MODULE_NOT_FOUND' },
    );
    const failed = loadQueueTracer(settings, 'w', debug(), () => Promise.reject(broken));
    await expect(failed).rejects.toThrow(SqlQueueConfigError);
    await expect(failed).rejects.toThrow(
      `tracing: loading the OpenTelemetry tracer failed (${broken.message}): reinstall @opentelemetry/api`,
    );
    await expect(failed).rejects.toMatchObject({ cause: broken });
  });

  it('builds the OpenTelemetry tracer with the options and the worker id', async () => {
    const made: unknown[] = [];
    class StandIn {
      constructor(options: unknown) {
        made.push(options);
      }
    }
    const tracer = await loadQueueTracer(settings, 'host:1:ab', debug(), async () => ({
      OtelQueueTracer: StandIn as never,
    }));
    expect(tracer).toBeInstanceOf(StandIn);
    expect(made).toEqual([{ consumerSpan: 'link', claimSpans: true, reaperSpans: false, clientId: 'host:1:ab' }]);
  });

  it('loads the real implementation when the API is installed', async () => {
    const { OtelQueueTracer } = await import('../../lib/src/tracing/otel.tracer.js');
    expect(await loadQueueTracer(settings, 'w', debug())).toBeInstanceOf(OtelQueueTracer);
  });
});
