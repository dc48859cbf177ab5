import { SqlQueueValidationError } from '../errors.js';
import { isHeaderText, MAX_TRACE_CONTEXT_LENGTH } from '../tracing.js';
import type { EnqueueOptions, NewJob } from '../types.js';
import { assertInteger, assertKeyText, assertQueueName, DAY_MS, MAX_ATTEMPTS_LIMIT } from '../validation.js';

// A caller's payload and options turned into a store-ready job, or refused before any SQL runs.

export const MAX_DELAY_MS = 50 * 365 * DAY_MS;

/** Every option an enqueued job takes; a compile error reminds whoever adds one to EnqueueOptions. */
const ENQUEUE_OPTIONS: Record<keyof EnqueueOptions, true> = {
  idempotencyKey: true,
  runAt: true,
  delayMs: true,
  priority: true,
  groupKey: true,
  concurrencyKey: true,
  maxAttempts: true,
};
export const ENQUEUE_OPTION_KEYS = Object.keys(ENQUEUE_OPTIONS) as readonly (keyof EnqueueOptions)[];

export interface JobValidationLimits {
  maxPayloadBytes: number;
  /** Stored when neither the call nor the queue's recorded setting says (see NewJob.maxAttempts). */
  defaultMaxAttempts: number;
}

/**
 * Turns a caller's payload and options into a store-ready job, or throws before any SQL runs.
 * `where` names the item in a bulk call so the message points at the bad one.
 */
export function prepareJob(
  queue: string,
  payload: unknown,
  options: EnqueueOptions | undefined,
  limits: JobValidationLimits,
  where = '',
): NewJob {
  const at = where ? ` (${where})` : '';
  assertQueueName(queue);
  const opts = options ?? {};
  const json = serializePayload(payload, limits.maxPayloadBytes, queue, at);

  if (opts.runAt !== undefined && opts.delayMs !== undefined) {
    throw new SqlQueueValidationError(`enqueue to '${queue}'${at}: give runAt or delayMs, not both`);
  }
  let runAt: Date | null = null;
  if (opts.runAt !== undefined) {
    if (!(opts.runAt instanceof Date) || Number.isNaN(opts.runAt.getTime())) {
      throw new SqlQueueValidationError(`enqueue to '${queue}'${at}: runAt must be a valid Date`);
    }
    runAt = opts.runAt;
  }
  const delayMs =
    opts.delayMs === undefined
      ? 0
      : assertInteger(`enqueue to '${queue}'${at}: delayMs`, opts.delayMs, 0, MAX_DELAY_MS, SqlQueueValidationError);
  const priority =
    opts.priority === undefined
      ? 0
      : assertInteger(`enqueue to '${queue}'${at}: priority`, opts.priority, -32768, 32767, SqlQueueValidationError);
  // Left null when not given: the queue's recorded setting must be able to win over this
  // process's default, which only the enqueue statement can read.
  const maxAttempts =
    opts.maxAttempts === undefined
      ? null
      : assertInteger(
          `enqueue to '${queue}'${at}: maxAttempts`,
          opts.maxAttempts,
          1,
          MAX_ATTEMPTS_LIMIT,
          SqlQueueValidationError,
        );
  const groupKey = optionalKey('groupKey', opts.groupKey, queue, at);
  const concurrencyKey = optionalKey('concurrencyKey', opts.concurrencyKey, queue, at);
  if (groupKey !== null && concurrencyKey !== null) {
    throw new SqlQueueValidationError(
      `enqueue to '${queue}'${at}: give groupKey or concurrencyKey, not both (an ordered group already runs one job at a time)`,
    );
  }
  return {
    queue,
    payload: json,
    priority,
    runAt,
    delayMs,
    groupKey,
    concurrencyKey,
    idempotencyKey: callerIdempotencyKey(opts.idempotencyKey, queue, at),
    maxAttempts,
    defaultMaxAttempts: limits.defaultMaxAttempts,
  };
}

/**
 * Gives prepared jobs the trace context of their enqueue (core/tracing.ts: the tracer's
 * encoded carrier; null leaves them without one, as most jobs are). A context that is not header
 * text of bounded length (a tracer's bug, never the caller's) is dropped: tracing must never fail
 * an enqueue, and the job runs without it.
 */
export function withTraceContext(jobs: readonly NewJob[], traceContext: string | null): void {
  if (
    typeof traceContext !== 'string' ||
    traceContext.length === 0 ||
    traceContext.length > MAX_TRACE_CONTEXT_LENGTH ||
    !isHeaderText(traceContext)
  ) {
    return;
  }
  for (const job of jobs) job.traceContext = traceContext;
}

/**
 * A \u0000 escape, or the escape JSON.stringify writes for an unpaired surrogate, in JSON text:
 * preceded by an even number of backslashes (none escaped it). jsonb refuses both.
 */
const UNSTORABLE_ESCAPE = /(?:^|[^\\])(?:\\\\)*\\u(?:0000|d[89a-f][0-9a-f]{2})/;
/** Idempotency keys of recurring jobs' ticks (`schedule:<id>:<tick>`): no caller may take one. */
export const SCHEDULE_KEY_PREFIX = 'schedule:';

function callerIdempotencyKey(value: unknown, queue: string, at: string): string | null {
  const key = optionalKey('idempotencyKey', value, queue, at);
  if (key?.startsWith(SCHEDULE_KEY_PREFIX)) {
    throw new SqlQueueValidationError(
      `enqueue to '${queue}'${at}: idempotencyKey '${key}' starts with '${SCHEDULE_KEY_PREFIX}', which is reserved for the jobs of recurring schedules: choose another key`,
    );
  }
  return key;
}

function optionalKey(name: string, value: unknown, queue: string, at: string): string | null {
  if (value === undefined || value === null) return null;
  return assertKeyText(`enqueue to '${queue}'${at}`, name, value);
}

function serializePayload(payload: unknown, maxBytes: number, queue: string, at: string): string {
  let json: string | undefined;
  try {
    json = JSON.stringify(payload);
  } catch (error) {
    throw new SqlQueueValidationError(
      `enqueue to '${queue}'${at}: payload is not JSON-serializable (${(error as Error).message})`,
    );
  }
  if (json === undefined) {
    throw new SqlQueueValidationError(
      `enqueue to '${queue}'${at}: payload is not JSON-serializable (got ${typeof payload})`,
    );
  }
  // A UTF-16 code unit is at most 3 UTF-8 bytes: most payloads are under the limit without counting.
  if (json.length * 3 > maxBytes) {
    const bytes = Buffer.byteLength(json, 'utf8');
    if (bytes > maxBytes) {
      throw new SqlQueueValidationError(
        `enqueue to '${queue}'${at}: payload is ${bytes} bytes of JSON, over the limit of ${maxBytes} (store large documents elsewhere and enqueue a reference)`,
      );
    }
  }
  // PostgreSQL's jsonb cannot hold U+0000 or an unpaired surrogate; refusing them here keeps both
  // dialects alike and the whole batch intact, instead of a database error after the call started.
  if (json.includes('\\u') && UNSTORABLE_ESCAPE.test(json)) {
    throw new SqlQueueValidationError(
      `enqueue to '${queue}'${at}: payload contains U+0000 or an unpaired surrogate, which PostgreSQL's jsonb cannot store`,
    );
  }
  return json;
}
