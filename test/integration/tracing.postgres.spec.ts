import 'reflect-metadata';
import { Body, Controller, Inject, Module, Post, type INestApplication } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ScheduleModule } from '@nestjs/schedule';
import { context, propagation, ROOT_CONTEXT, SpanKind, SpanStatusCode, trace } from '@opentelemetry/api';
import { InMemorySpanExporter, type ReadableSpan } from '@opentelemetry/sdk-trace-base';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { QueueProducer, SqlQueueModule, type SqlQueueModuleOptions } from '../../lib/src/index.js';
import { CaptureLogger } from '../helpers/capture-logger.js';
import { dropPgSchema, PG_URL, sql, uniqueSchema } from '../helpers/databases.js';
import { killAllWorkers, WorkerProcess, type WorkerMessage } from '../helpers/worker-process.js';
import { registerOtelSdk, unregisterOtelSdk } from '../helpers/otel.js';
import { waitFor } from '../helpers/wait-for.js';
import type { SpanMessage, TracingWorkerConfig } from '../workers/tracing-worker.js';

/**
 * Issue 15: a request that enqueues a job and the handler that runs it later in another process
 * are one trace. This process is the producer: a real Nest HTTP application whose middleware
 * makes the server span (as an HTTP instrumentation would), with the OpenTelemetry SDK and the
 * in-memory exporter. The handlers run in worker processes (test/workers/tracing-worker.ts)
 * with their own SDK, which send every span they end back over IPC.
 */

const schema = uniqueSchema('tracing');
const exporter = new InMemorySpanExporter();
const workers: WorkerProcess[] = [];
const apps: INestApplication[] = [];
const tracer = () => trace.getTracer('test');

beforeAll(() => registerOtelSdk(exporter));

afterEach(async () => {
  await Promise.all([...apps.splice(0).map((app) => app.close()), ...workers.splice(0).map((worker) => worker.stop())]);
  exporter.reset();
});

afterAll(async () => {
  await killAllWorkers();
  unregisterOtelSdk();
  await dropPgSchema(schema);
});

interface EnqueueBody {
  queue: string;
  failTimes?: number;
  count?: number;
}

/** The producer application: POST /orders enqueues one job, with `count` it enqueues that many at once. */
async function startProducer(options: Partial<SqlQueueModuleOptions> = {}): Promise<{ url: string }> {
  @Controller('orders')
  class OrdersController {
    constructor(@Inject(QueueProducer) private readonly producer: QueueProducer) {}

    @Post()
    async create(@Body() body: EnqueueBody): Promise<{ jobIds: string[] }> {
      if (body.count === undefined) {
        return { jobIds: [(await this.producer.enqueue(body.queue, { failTimes: body.failTimes ?? 0 })).jobId] };
      }
      const items = Array.from({ length: body.count }, () => ({ payload: { failTimes: 0 } }));
      return { jobIds: (await this.producer.enqueueMany(body.queue, items)).map((result) => result.jobId) };
    }
  }

  @Module({
    imports: [
      ScheduleModule.forRoot(),
      SqlQueueModule.forRoot({
        connection: { dialect: 'postgres', url: PG_URL, poolSize: 4 },
        schema,
        consumer: { enabled: false },
        ...options,
      }),
    ],
    controllers: [OrdersController],
  })
  class ProducerModule {}

  const app = await NestFactory.create(ProducerModule, { logger: new CaptureLogger(), abortOnError: false });
  // The server span of an HTTP instrumentation: continues the caller's trace from its headers.
  app.use((req: IncomingMessage, res: ServerResponse, next: () => void) => {
    const parent = propagation.extract(ROOT_CONTEXT, req.headers);
    const span = tracer().startSpan(`${req.method} ${req.url}`, { kind: SpanKind.SERVER }, parent);
    res.on('finish', () => span.end());
    context.with(trace.setSpan(parent, span), next);
  });
  apps.push(app);
  await app.listen(0, '127.0.0.1');
  const { port } = (app.getHttpServer() as { address(): { port: number } }).address();
  return { url: `http://127.0.0.1:${port}` };
}

/** A client's request to the producer, inside a client span whose context travels in its headers. */
async function request(url: string, body: EnqueueBody): Promise<{ jobIds: string[]; client: ReadableSpan }> {
  const client = tracer().startSpan('POST /orders (client)', { kind: SpanKind.CLIENT }, ROOT_CONTEXT);
  const headers: Record<string, string> = { 'content-type': 'application/json' };
  propagation.inject(trace.setSpan(ROOT_CONTEXT, client), headers);
  const response = await fetch(`${url}/orders`, {
    method: 'POST',
    headers,
    body: JSON.stringify(body),
    signal: AbortSignal.timeout(20_000),
  });
  client.end();
  expect(response.status).toBe(201);
  const { jobIds } = (await response.json()) as { jobIds: string[] };
  return { jobIds, client: client as unknown as ReadableSpan };
}

async function startWorker(queue: string, config: Partial<TracingWorkerConfig> = {}): Promise<WorkerProcess> {
  const worker = await WorkerProcess.start(
    { url: PG_URL, schema, queue, minPollMs: 20, maxPollMs: 200, ...config },
    'tracing-worker.js',
  );
  workers.push(worker);
  return worker;
}

/** The worker's spans named `name`, once `count` of them have arrived. */
async function workerSpans(worker: WorkerProcess, name: string, count: number): Promise<SpanMessage[]> {
  const spans = () => worker.received('span').filter((m) => m.name === name) as unknown as SpanMessage[];
  await waitFor(
    () => spans().length,
    (n) => n >= count,
    { what: `${count} '${name}' span(s)`, timeoutMs: 20_000 },
  );
  return spans();
}

/** The trace context column of a job's row, read with a connection of the test's own. */
async function storedTraceContext(jobId: string): Promise<string | null> {
  const [row] = await sql<{ trace_context: string | null }>(
    PG_URL,
    `SELECT trace_context FROM "${schema}".jobs WHERE id = $1`,
    [jobId],
  );
  return row!.trace_context;
}

const finished = (name: string) => exporter.getFinishedSpans().filter((span) => span.name === name);
const ids = (span: ReadableSpan) => span.spanContext();

describe('one trace from an HTTP request through enqueue to the handler in another process', () => {
  it('client → server → send (this process) → process (the worker), each the parent of the next', async () => {
    const { url } = await startProducer();
    const worker = await startWorker('traced');
    const { jobIds, client } = await request(url, { queue: 'traced' });

    const [server] = await waitFor(
      () => finished('POST /orders'),
      (spans) => spans.length === 1,
    );
    const [sent] = finished('send traced');
    const [processed] = await workerSpans(worker, 'process traced', 1);
    const traceId = ids(client).traceId;
    expect(ids(server!).traceId).toBe(traceId);
    expect(server!.parentSpanContext?.spanId).toBe(ids(client).spanId);
    expect(ids(sent!).traceId).toBe(traceId);
    expect(sent!.parentSpanContext?.spanId).toBe(ids(server!).spanId);
    expect(sent!.kind).toBe(SpanKind.PRODUCER);
    expect(sent!.attributes['messaging.message.id']).toBe(jobIds[0]);
    expect(processed).toMatchObject({
      traceId,
      parentSpanId: ids(sent!).spanId,
      kind: SpanKind.CONSUMER,
      links: [{ traceId, spanId: ids(sent!).spanId }],
      attributes: {
        'messaging.system': 'nestjs_sql_queue',
        'messaging.destination.name': 'traced',
        'messaging.operation.type': 'process',
        'messaging.message.id': jobIds[0],
        'messaging.nestjs_sql_queue.message.retry_count': 0,
      },
    });
    // The handler ran inside its span (its own spans would be children of it).
    const handled = await worker.next((m: WorkerMessage) => m.type === 'handled' && m.jobId === jobIds[0]);
    expect(handled.spanId).toBe(processed!.spanId);

    // What travelled: the W3C traceparent of the send span, in the job's row.
    expect(JSON.parse((await storedTraceContext(jobIds[0]!))!)).toEqual({
      traceparent: `00-${traceId}-${ids(sent!).spanId}-01`,
    });
  });

  it('a failing job: one process span per attempt in the same trace, errors recorded on the failed ones', async () => {
    const { url } = await startProducer();
    const worker = await startWorker('retried');
    const { jobIds, client } = await request(url, { queue: 'retried', failTimes: 2 });
    const spans = await workerSpans(worker, 'process retried', 3);
    const [sent] = finished('send retried');
    const byAttempt = spans.sort(
      (a, b) =>
        (a.attributes['messaging.nestjs_sql_queue.message.retry_count'] as number) -
        (b.attributes['messaging.nestjs_sql_queue.message.retry_count'] as number),
    );
    expect(byAttempt.map((span) => span.attributes['messaging.nestjs_sql_queue.message.retry_count'])).toEqual([
      0, 1, 2,
    ]);
    for (const span of byAttempt) {
      expect(span.traceId).toBe(ids(client).traceId);
      expect(span.parentSpanId).toBe(ids(sent!).spanId);
      expect(span.attributes['messaging.message.id']).toBe(jobIds[0]);
    }
    expect(new Set(byAttempt.map((span) => span.spanId)).size).toBe(3);
    for (const [index, failed] of byAttempt.slice(0, 2).entries()) {
      expect(failed.status).toEqual({ code: SpanStatusCode.ERROR, message: `attempt ${index + 1} fails on purpose` });
      expect(failed.attributes['error.type']).toBe('Error');
      expect(failed.events.map((event) => event.name)).toEqual(['exception']);
      expect(failed.events[0]!.attributes['exception.message']).toBe(`attempt ${index + 1} fails on purpose`);
    }
    expect(byAttempt[2]!.status.code).toBe(SpanStatusCode.UNSET);
    expect(byAttempt[2]!.events).toEqual([]);
  });

  it("enqueueMany: one send span, and every job's process span is its child and links to it", async () => {
    const { url } = await startProducer();
    const worker = await startWorker('bulk');
    const { jobIds } = await request(url, { queue: 'bulk', count: 4 });
    const spans = await workerSpans(worker, 'process bulk', 4);
    const sent = finished('send bulk');
    expect(sent).toHaveLength(1);
    expect(sent[0]!.attributes['messaging.batch.message_count']).toBe(4);
    expect(spans.map((span) => span.attributes['messaging.message.id']).sort()).toEqual([...jobIds].sort());
    for (const span of spans) {
      expect(span.traceId).toBe(ids(sent[0]!).traceId);
      expect(span.parentSpanId).toBe(ids(sent[0]!).spanId);
      expect(span.links).toEqual([{ traceId: ids(sent[0]!).traceId, spanId: ids(sent[0]!).spanId }]);
    }
  });

  it("consumerSpan 'link': the handler's span starts a trace of its own, linked to the send span", async () => {
    const { url } = await startProducer();
    const worker = await startWorker('linked', { consumerSpan: 'link' });
    const { client } = await request(url, { queue: 'linked' });
    const [processed] = await workerSpans(worker, 'process linked', 1);
    const [sent] = finished('send linked');
    expect(processed!.parentSpanId).toBeNull();
    expect(processed!.traceId).not.toBe(ids(client).traceId);
    expect(processed!.links).toEqual([{ traceId: ids(client).traceId, spanId: ids(sent!).spanId }]);
  });

  it('tracing off in the producer: nothing is stored or recorded there, and the job still runs (a root span)', async () => {
    const { url } = await startProducer({ tracing: { enabled: false } });
    const worker = await startWorker('untraced');
    const { jobIds } = await request(url, { queue: 'untraced' });
    const [processed] = await workerSpans(worker, 'process untraced', 1);
    expect(finished('send untraced')).toEqual([]);
    expect(processed!.parentSpanId).toBeNull();
    expect(processed!.links).toEqual([]);
    expect(await storedTraceContext(jobIds[0]!)).toBeNull();
  });
});
