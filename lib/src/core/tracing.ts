import type { ClaimedJob, EnqueueResult, ReapedJob } from './types.js';

/**
 * What the engine asks of tracing, so that a request that enqueues a job and the handler that
 * runs it later, in another process, are one trace. Core knows no tracing library: the
 * OpenTelemetry implementation lives in lib/src/tracing (loaded only when `@opentelemetry/api`
 * is installed), and NO_TRACING stands in when tracing is off or the API is absent.
 *
 * The trace context a job carries is text (see encodeTraceCarrier): what the application's
 * propagator writes (W3C `traceparent`/`tracestate` by default), stored in the job's row.
 */
export interface QueueTracer {
  /**
   * Runs an enqueue in a producer span. `send` prepares and writes the jobs, each carrying the
   * trace context it is given (null: none). `batchSize` is the item count of a bulk call
   * (enqueueMany), null for a single enqueue.
   */
  send<T extends EnqueueResult | readonly EnqueueResult[]>(
    queue: string,
    batchSize: number | null,
    send: (traceContext: string | null) => Promise<T>,
  ): Promise<T>;
  /** Runs a job's handler in a consumer span related to the span that enqueued the job. */
  process<T>(job: ClaimedJob, run: () => Promise<T>): Promise<T>;
  /** A claim statement, in a span of its own when the `claimSpans` option asks for one. */
  claim(queue: string, limit: number, claim: () => Promise<ClaimedJob[]>): Promise<ClaimedJob[]>;
  /** A reaper run, in a span of its own when the `reaperSpans` option asks for one. */
  reap(reap: () => Promise<ReapedJob[]>): Promise<ReapedJob[]>;
}

/** Tracing off, or `@opentelemetry/api` not installed: every call runs as it would without tracing. */
export const NO_TRACING: QueueTracer = {
  send: (_queue, _batchSize, send) => send(null),
  process: (_job, run) => run(),
  claim: (_queue, _limit, claim) => claim(),
  reap: (reap) => reap(),
};

/**
 * Longest trace context a job stores (the column's width in both dialects): a `traceparent` is
 * 55 characters and vendors keep `tracestate` within 512, which leaves room for some baggage.
 */
export const MAX_TRACE_CONTEXT_LENGTH = 2048;

/** Header names and values as propagators write them: printable ASCII. */
export function isHeaderText(value: string): boolean {
  return /^[\x20-\x7e]+$/.test(value);
}

/**
 * A propagator's carrier (header name → value) as the text a job stores: a small JSON object,
 * so that any propagator the application registers (W3C trace context, baggage, B3…) travels.
 * Null when there is nothing to carry. Over MAX_TRACE_CONTEXT_LENGTH, only `traceparent` is kept
 * (the part that joins the trace); a carrier that cannot be stored as header text is dropped:
 * tracing never fails an enqueue.
 */
export function encodeTraceCarrier(carrier: Readonly<Record<string, string>>): string | null {
  const entries = Object.entries(carrier).filter(
    ([name, value]) => typeof value === 'string' && isHeaderText(name) && isHeaderText(value),
  );
  if (entries.length === 0) return null;
  const text = JSON.stringify(Object.fromEntries(entries));
  if (text.length <= MAX_TRACE_CONTEXT_LENGTH) return text;
  const traceparent = carrier['traceparent'];
  if (traceparent === undefined || !isHeaderText(traceparent)) return null;
  const short = JSON.stringify({ traceparent });
  return short.length <= MAX_TRACE_CONTEXT_LENGTH ? short : null;
}

/**
 * The carrier a job's stored trace context holds; empty for none. Text that is not such a
 * carrier (a row written by hand, say) yields nothing rather than an error: a job must run
 * whatever its trace context says.
 */
export function decodeTraceCarrier(text: string | null | undefined): Record<string, string> {
  if (!text) return {};
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    return {};
  }
  if (!parsed || typeof parsed !== 'object' || Array.isArray(parsed)) return {};
  const carrier: Record<string, string> = {};
  for (const [name, value] of Object.entries(parsed)) {
    if (typeof value === 'string') carrier[name] = value;
  }
  return carrier;
}
