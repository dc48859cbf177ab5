import {
  context,
  propagation,
  ROOT_CONTEXT,
  SpanKind,
  SpanStatusCode,
  trace,
  type Context,
  type TextMapPropagator,
} from '@opentelemetry/api';
import { InMemorySpanExporter, type ReadableSpan } from '@opentelemetry/sdk-trace-base';
import { afterEach, describe, expect, it } from 'vitest';
import { decodeTraceCarrier } from '../../lib/src/core/tracing.js';
import type { ClaimedJob, EnqueueResult } from '../../lib/src/core/types.js';
import { OtelQueueTracer, type OtelTracerOptions } from '../../lib/src/tracing/otel.tracer.js';
import { claimedJob } from '../helpers/engine.js';
import { registerOtelSdk, unregisterOtelSdk } from '../helpers/otel.js';

/**
 * The OpenTelemetry tracer in one process, against the SDK's in-memory exporter: the spans'
 * names, kinds, attributes and relations. (Across processes and the database:
 * test/integration/tracing.postgres.spec.ts.)
 */

const OPTIONS: OtelTracerOptions = { consumerSpan: 'child', claimSpans: false, reaperSpans: false, clientId: 'w-1' };

const registerSdk = () => registerOtelSdk(new InMemorySpanExporter());

afterEach(unregisterOtelSdk);

/** An enqueue of `count` jobs through the tracer, as the producer makes one; returns the stored context. */
async function send(tracer: OtelQueueTracer, batchSize: number | null = null): Promise<string | null> {
  let stored: string | null = null;
  const result = { jobId: '41', created: true };
  await tracer.send('orders', batchSize, async (traceContext): Promise<EnqueueResult | EnqueueResult[]> => {
    stored = traceContext;
    return batchSize === null ? result : [result];
  });
  return stored;
}

const job = (traceContext: string | null, fields: Partial<ClaimedJob> = {}) =>
  claimedJob('41', 'token', { queue: 'orders', traceContext, ...fields });

const byName = (spans: ReadableSpan[], name: string) => spans.filter((span) => span.name === name);

describe('OpenTelemetry tracer without an SDK', () => {
  it("stores no trace context and runs every call as given (the API's no-op spans)", async () => {
    const tracer = new OtelQueueTracer(OPTIONS);
    expect(await send(tracer)).toBeNull();
    expect(await tracer.process(job(null), async () => 'ran')).toBe('ran');
    await expect(tracer.process(job(null), () => Promise.reject(new Error('boom')))).rejects.toThrow('boom');
  });
});

describe('OpenTelemetry tracer with an SDK', () => {
  it('enqueue: a PRODUCER span `send <queue>` whose context each job stores (W3C traceparent)', async () => {
    const exporter = registerSdk();
    const tracer = new OtelQueueTracer(OPTIONS);
    const outer = trace.getTracer('test').startSpan('request');
    const stored = await context.with(trace.setSpan(context.active(), outer), () => send(tracer));
    outer.end();
    const [sent] = byName(exporter.getFinishedSpans(), 'send orders');
    expect(sent!.kind).toBe(SpanKind.PRODUCER);
    expect(sent!.parentSpanContext?.spanId).toBe(outer.spanContext().spanId);
    expect(sent!.attributes).toEqual({
      'messaging.system': 'nestjs_sql_queue',
      'messaging.destination.name': 'orders',
      'messaging.operation.type': 'send',
      'messaging.operation.name': 'send',
      'messaging.client.id': 'w-1',
      'messaging.message.id': '41',
    });
    const { traceId, spanId } = sent!.spanContext();
    expect(decodeTraceCarrier(stored)).toEqual({ traceparent: `00-${traceId}-${spanId}-01` });
  });

  it('enqueueMany: one send span with the batch size, no message id', async () => {
    const exporter = registerSdk();
    await send(new OtelQueueTracer(OPTIONS), 3);
    const [sent] = byName(exporter.getFinishedSpans(), 'send orders');
    expect(sent!.attributes['messaging.batch.message_count']).toBe(3);
    expect(sent!.attributes['messaging.message.id']).toBeUndefined();
  });

  it("a failed enqueue records the exception and sets the span's status", async () => {
    const exporter = registerSdk();
    const tracer = new OtelQueueTracer(OPTIONS);
    const refused = tracer.send('orders', null, () => Promise.reject(new TypeError('database refused')));
    await expect(refused).rejects.toThrow('database refused');
    const [sent] = byName(exporter.getFinishedSpans(), 'send orders');
    expect(sent!.status).toEqual({ code: SpanStatusCode.ERROR, message: 'database refused' });
    expect(sent!.attributes['error.type']).toBe('TypeError');
    expect(sent!.events.map((event) => event.name)).toEqual(['exception']);
  });

  it("process (child, the default): a CONSUMER span, child of and linked to the enqueue's span, active in the handler", async () => {
    const exporter = registerSdk();
    const tracer = new OtelQueueTracer(OPTIONS);
    const stored = await send(tracer);
    let activeInHandler: string | undefined;
    await tracer.process(job(stored, { attempt: 3, groupKey: 'customer-7' }), async () => {
      await Promise.resolve();
      activeInHandler = trace.getActiveSpan()?.spanContext().spanId;
    });
    const [sent] = byName(exporter.getFinishedSpans(), 'send orders');
    const [processed] = byName(exporter.getFinishedSpans(), 'process orders');
    expect(processed!.kind).toBe(SpanKind.CONSUMER);
    expect(processed!.spanContext().traceId).toBe(sent!.spanContext().traceId);
    expect(processed!.parentSpanContext?.spanId).toBe(sent!.spanContext().spanId);
    expect(processed!.links.map((link) => link.context.spanId)).toEqual([sent!.spanContext().spanId]);
    expect(activeInHandler).toBe(processed!.spanContext().spanId);
    expect(processed!.attributes).toEqual({
      'messaging.system': 'nestjs_sql_queue',
      'messaging.destination.name': 'orders',
      'messaging.operation.type': 'process',
      'messaging.operation.name': 'process',
      'messaging.client.id': 'w-1',
      'messaging.message.id': '41',
      'messaging.nestjs_sql_queue.message.retry_count': 2,
      'messaging.nestjs_sql_queue.message.group_key': 'customer-7',
    });
    expect(processed!.status.code).toBe(SpanStatusCode.UNSET);
  });

  it("process with consumerSpan 'link': a new trace, linked to the enqueue's span", async () => {
    const exporter = registerSdk();
    const stored = await send(new OtelQueueTracer(OPTIONS));
    await new OtelQueueTracer({ ...OPTIONS, consumerSpan: 'link' }).process(job(stored), async () => undefined);
    const [sent] = byName(exporter.getFinishedSpans(), 'send orders');
    const [processed] = byName(exporter.getFinishedSpans(), 'process orders');
    expect(processed!.parentSpanContext).toBeUndefined();
    expect(processed!.spanContext().traceId).not.toBe(sent!.spanContext().traceId);
    expect(processed!.links.map(({ context: { traceId, spanId } }) => ({ traceId, spanId }))).toEqual([
      { traceId: sent!.spanContext().traceId, spanId: sent!.spanContext().spanId },
    ]);
  });

  it('a failed handler: exception event, error.type and status ERROR; a job without a context is a root span', async () => {
    const exporter = registerSdk();
    const tracer = new OtelQueueTracer(OPTIONS);
    class PaymentDeclined extends Error {}
    // Run inside another span: the job's span must not become its child (a reader loop's context).
    const ambient = trace.getTracer('test').startSpan('ambient');
    const failing = context.with(trace.setSpan(ROOT_CONTEXT, ambient), () =>
      tracer.process(job(null), () => {
        throw new PaymentDeclined('card declined');
      }),
    );
    await expect(failing).rejects.toThrow('card declined');
    const [processed] = byName(exporter.getFinishedSpans(), 'process orders');
    expect(processed!.parentSpanContext).toBeUndefined();
    expect(processed!.links).toEqual([]);
    expect(processed!.status).toEqual({ code: SpanStatusCode.ERROR, message: 'card declined' });
    expect(processed!.attributes['error.type']).toBe('PaymentDeclined');
    expect(processed!.events[0]!.name).toBe('exception');
    expect(processed!.events[0]!.attributes?.['exception.message']).toBe('card declined');
  });

  it('a propagator that throws costs jobs their trace context, never an enqueue or a handler run', async () => {
    const exporter = registerSdk();
    const throwing: TextMapPropagator = {
      inject() {
        throw new Error('inject failed');
      },
      extract(): Context {
        throw new Error('extract failed');
      },
      fields: () => ['traceparent'],
    };
    propagation.disable();
    propagation.setGlobalPropagator(throwing);
    const tracer = new OtelQueueTracer(OPTIONS);
    expect(await send(tracer)).toBeNull();
    const stored = `{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}`;
    expect(await tracer.process(job(stored), async () => 'ran')).toBe('ran');
    const [processed] = byName(exporter.getFinishedSpans(), 'process orders');
    expect(processed!.parentSpanContext).toBeUndefined();
    expect(processed!.links).toEqual([]);
  });

  it('claim and reap statements run inside their spans, so database client spans nest under them', async () => {
    const exporter = registerSdk();
    const tracer = new OtelQueueTracer({ ...OPTIONS, claimSpans: true, reaperSpans: true });
    let activeInClaim: string | undefined;
    let activeInReap: string | undefined;
    await tracer.claim('orders', 10, async () => {
      await Promise.resolve();
      activeInClaim = trace.getActiveSpan()?.spanContext().spanId;
      return [];
    });
    await tracer.reap(async () => {
      await Promise.resolve();
      activeInReap = trace.getActiveSpan()?.spanContext().spanId;
      return [];
    });
    const [claim] = byName(exporter.getFinishedSpans(), 'claim orders');
    const [reap] = byName(exporter.getFinishedSpans(), 'reap');
    expect(activeInClaim).toBe(claim!.spanContext().spanId);
    expect(activeInReap).toBe(reap!.spanContext().spanId);
  });

  it('claim and reap spans only when asked for', async () => {
    const exporter = registerSdk();
    const stored = await send(new OtelQueueTracer(OPTIONS));
    const claimed = [job(stored), job(null, { id: '42' })];
    await new OtelQueueTracer(OPTIONS).claim('orders', 10, async () => claimed);
    await new OtelQueueTracer(OPTIONS).reap(async () => []);
    expect(exporter.getFinishedSpans().map((span) => span.name)).toEqual(['send orders']);

    const asked = new OtelQueueTracer({ ...OPTIONS, claimSpans: true, reaperSpans: true });
    expect(await asked.claim('orders', 10, async () => claimed)).toBe(claimed);
    await asked.reap(async () => [{ id: '9', queue: 'orders', state: 'dead', attempt: 3 }]);
    const [sent] = byName(exporter.getFinishedSpans(), 'send orders');
    const [claim] = byName(exporter.getFinishedSpans(), 'claim orders');
    expect(claim!.kind).toBe(SpanKind.CLIENT);
    expect(claim!.attributes).toMatchObject({
      'messaging.operation.type': 'receive',
      'messaging.operation.name': 'claim',
      'messaging.batch.message_count': 2,
    });
    expect(claim!.links.map((link) => link.context.spanId)).toEqual([sent!.spanContext().spanId]);
    const [reap] = byName(exporter.getFinishedSpans(), 'reap');
    expect(reap!.attributes).toMatchObject({
      'messaging.operation.name': 'reap',
      'messaging.batch.message_count': 1,
      'messaging.nestjs_sql_queue.reap.dead_count': 1,
    });
  });
});
