import {
  context,
  propagation,
  ROOT_CONTEXT,
  SpanKind,
  SpanStatusCode,
  trace,
  type Attributes,
  type Context,
  type Link,
  type Span,
  type Tracer,
} from '@opentelemetry/api';
import { decodeTraceCarrier, encodeTraceCarrier, type QueueTracer } from '../core/tracing.js';
import type { ClaimedJob, EnqueueResult, ReapedJob } from '../core/types.js';

/**
 * The queue's spans over `@opentelemetry/api`, after the OpenTelemetry semantic conventions for
 * messaging spans (the current ones: operation types send/receive/process, span names
 * `{operation} {queue}`, status Development):
 * - `send <queue>` (PRODUCER) around enqueue and enqueueMany; its context is the creation
 *   context every job of the call stores (no per-job "create" span: a bulk enqueue of 10,000
 *   jobs would otherwise make 10,000 spans);
 * - `process <queue>` (CONSUMER) around each attempt's handler, linked to the job's creation
 *   context and, with `consumerSpan: 'child'` (the default), its child: enqueue and handler are
 *   then one trace, and retries are sibling process spans in it. With 'link', each attempt
 *   starts a trace of its own;
 * - `claim <queue>` (CLIENT, operation type receive) and `reap` (CLIENT), only when asked for.
 *
 * Without an SDK registered the API hands out non-recording spans and a no-op propagator: each
 * call then costs a few object allocations, and no job stores a trace context.
 */

/** `messaging.system`: a custom value (no well-known one applies), usable as the attribute namespace below. */
export const MESSAGING_SYSTEM = 'nestjs_sql_queue';
/** Retries before this attempt (attempt - 1); the conventions define no system-neutral attribute for it. */
export const ATTR_RETRY_COUNT = `messaging.${MESSAGING_SYSTEM}.message.retry_count`;
export const ATTR_GROUP_KEY = `messaging.${MESSAGING_SYSTEM}.message.group_key`;

export interface OtelTracerOptions {
  consumerSpan: 'child' | 'link';
  claimSpans: boolean;
  reaperSpans: boolean;
  /** `messaging.client.id` of this process's spans (the worker id). */
  clientId: string;
}

export class OtelQueueTracer implements QueueTracer {
  private readonly tracer: Tracer;

  constructor(private readonly options: OtelTracerOptions) {
    // A proxy: an SDK registered after boot is used from then on.
    this.tracer = trace.getTracer('nestjs-sql-queue');
  }

  async send<T extends EnqueueResult | readonly EnqueueResult[]>(
    queue: string,
    batchSize: number | null,
    send: (traceContext: string | null) => Promise<T>,
  ): Promise<T> {
    const attributes = this.attributes(queue, 'send', 'send');
    if (batchSize !== null) attributes['messaging.batch.message_count'] = batchSize;
    const span = this.tracer.startSpan(`send ${queue}`, { kind: SpanKind.PRODUCER, attributes });
    const active = trace.setSpan(context.active(), span);
    // Injected even from a span that does not record (sampled out): the handler's side then
    // makes the same sampling decision.
    const traceContext = inject(active);
    if (!span.isRecording()) return send(traceContext);
    return this.finish(
      span,
      () => context.with(active, send, undefined, traceContext),
      (result) => {
        if (!Array.isArray(result)) span.setAttribute('messaging.message.id', (result as EnqueueResult).jobId);
      },
    );
  }

  async process<T>(job: ClaimedJob, run: () => Promise<T>): Promise<T> {
    const attributes = this.attributes(job.queue, 'process', 'process');
    attributes['messaging.message.id'] = job.id;
    attributes[ATTR_RETRY_COUNT] = job.attempt - 1;
    if (job.groupKey !== null) attributes[ATTR_GROUP_KEY] = job.groupKey;
    // Extracted into an empty context, never the reader loop's: a job's span relates to its
    // enqueue only. The extracted context's baggage reaches the handler in both modes.
    const creation = creationOf(job);
    const parent =
      creation === null
        ? ROOT_CONTEXT
        : this.options.consumerSpan === 'child'
          ? creation.context
          : trace.deleteSpan(creation.context);
    const span = this.tracer.startSpan(
      `process ${job.queue}`,
      { kind: SpanKind.CONSUMER, attributes, ...(creation?.link ? { links: [creation.link] } : {}) },
      parent,
    );
    const active = trace.setSpan(parent, span);
    if (!span.isRecording()) return context.with(active, run);
    return this.finish(span, () => context.with(active, run));
  }

  async claim(queue: string, limit: number, claim: () => Promise<ClaimedJob[]>): Promise<ClaimedJob[]> {
    if (!this.options.claimSpans) return claim();
    const attributes = this.attributes(queue, 'receive', 'claim');
    // A trace of its own: a claim serves whatever jobs are due, not the context it runs in.
    const span = this.tracer.startSpan(`claim ${queue}`, { kind: SpanKind.CLIENT, attributes }, ROOT_CONTEXT);
    span.setAttribute(`messaging.${MESSAGING_SYSTEM}.claim.limit`, limit);
    return this.finish(span, within(span, claim), (claimed) => {
      span.setAttribute('messaging.batch.message_count', claimed.length);
      // The conventions ask a receive span to link each message's creation context; links
      // added after the start need API 1.9 (older APIs record the count only).
      const links = claimed.flatMap((job) => creationOf(job)?.link ?? []);
      if (links.length > 0) (span as Span & { addLinks?: (links: Link[]) => Span }).addLinks?.(links);
    });
  }

  async reap(reap: () => Promise<ReapedJob[]>): Promise<ReapedJob[]> {
    if (!this.options.reaperSpans) return reap();
    const attributes: Attributes = {
      'messaging.system': MESSAGING_SYSTEM,
      'messaging.operation.name': 'reap',
      'messaging.client.id': this.options.clientId,
    };
    const span = this.tracer.startSpan('reap', { kind: SpanKind.CLIENT, attributes }, ROOT_CONTEXT);
    return this.finish(span, within(span, reap), (reaped) => {
      span.setAttribute('messaging.batch.message_count', reaped.length);
      span.setAttribute(
        `messaging.${MESSAGING_SYSTEM}.reap.dead_count`,
        reaped.filter((j) => j.state === 'dead').length,
      );
    });
  }

  private attributes(queue: string, type: string, name: string): Attributes {
    return {
      'messaging.system': MESSAGING_SYSTEM,
      'messaging.destination.name': queue,
      'messaging.operation.type': type,
      'messaging.operation.name': name,
      'messaging.client.id': this.options.clientId,
    };
  }

  /** Runs `work` and ends its span, recording its outcome (a synchronous throw included). */
  private async finish<T>(span: Span, work: () => Promise<T>, done?: (value: T) => void): Promise<T> {
    try {
      const value = await work();
      done?.(value);
      return value;
    } catch (error) {
      failed(span, error);
      throw error;
    } finally {
      span.end();
    }
  }
}

/** The active context as the text a job stores (null: nothing to carry, as without an SDK). */
function inject(active: Context): string | null {
  const carrier: Record<string, string> = {};
  try {
    propagation.inject(active, carrier);
  } catch {
    // The application's propagator (not always wrapped in the SDK's composite, which catches):
    // its failure costs the jobs their trace context, never the enqueue.
    return null;
  }
  return encodeTraceCarrier(carrier);
}

/** Runs `work` with `span` active (in a trace of its own), so that database client spans nest under it. */
function within<T>(span: Span, work: () => Promise<T>): () => Promise<T> {
  return () => context.with(trace.setSpan(ROOT_CONTEXT, span), work);
}

/** The context a job's enqueue stored, and a link to its span when it names a valid one. */
function creationOf(job: ClaimedJob): { context: Context; link: Link | null } | null {
  if (!job.traceContext) return null;
  let extracted: Context;
  try {
    extracted = propagation.extract(ROOT_CONTEXT, decodeTraceCarrier(job.traceContext));
  } catch {
    // The stored text is untrusted input: a propagator that throws on it leaves the job without
    // a creation context, and the handler still runs (else every attempt would fail the same way).
    return null;
  }
  const spanContext = trace.getSpanContext(extracted);
  return {
    context: extracted,
    link: spanContext && trace.isSpanContextValid(spanContext) ? { context: spanContext } : null,
  };
}

/** The conventions' failure: the exception as an event, `error.type`, and status ERROR. */
function failed(span: Span, error: unknown): void {
  const type = error instanceof Error ? error.constructor.name || error.name : typeof error;
  span.setAttribute('error.type', type);
  if (error instanceof Error) span.recordException(error);
  else span.recordException(String(error));
  span.setStatus({
    code: SpanStatusCode.ERROR,
    message: error instanceof Error ? error.message : String(error),
  });
}
