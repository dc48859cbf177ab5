import { SqlQueueConfigError, SqlQueueValidationError } from './errors.js';
import { isHeaderText, MAX_TRACE_CONTEXT_LENGTH } from './tracing.js';
import type { EnqueueOptions, NewJob, QueueSetting } from './types.js';

const QUEUE_NAME = /^[A-Za-z0-9._-]{1,128}$/;
// Lowest common denominator of PostgreSQL (63 bytes) and SQL Server identifiers, ASCII only,
// so the same name is valid, unambiguous and safe to quote in both dialects.
const SCHEMA_NAME = /^[A-Za-z_][A-Za-z0-9_]{0,62}$/;
const KEY_MAX_LENGTH = 255;
export const DAY_MS = 86_400_000;
const MAX_DELAY_MS = 50 * 365 * DAY_MS;
/** Longest age a retention or purge takes (ten years): 'now - age' stays a computable timestamp. */
export const MAX_AGE_MS = 3650 * DAY_MS;
export const MAX_ATTEMPTS_LIMIT = 10_000;
/** Largest int in SQL Server (DATEADD(millisecond, …), int columns): bounds of leases and delays. */
export const INT_MAX = 2_147_483_647;
export const DEFAULT_MAX_ATTEMPTS = 25;
export const DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024;

type ErrorClass = new (message: string) => Error;

export function assertQueueName(queue: unknown, error: ErrorClass = SqlQueueValidationError): string {
  if (typeof queue !== 'string' || !QUEUE_NAME.test(queue)) {
    throw new error(
      `queue name ${describe(queue)} is invalid: use letters, digits, '.', '-', '_' (1 to 128 characters)`,
    );
  }
  return queue;
}

export function assertSchemaName(schema: unknown): string {
  if (typeof schema !== 'string' || !SCHEMA_NAME.test(schema)) {
    throw new SqlQueueConfigError(
      `schema name ${describe(schema)} is invalid: start with a letter or '_', then letters, digits or '_' (max 63 characters)`,
    );
  }
  return schema;
}

/** Integer option check shared by module, queue and handler options. */
export function assertInteger(
  name: string,
  value: unknown,
  min: number,
  max: number,
  error: ErrorClass = SqlQueueConfigError,
): number {
  if (typeof value !== 'number' || !Number.isInteger(value) || value < min || value > max) {
    throw new error(`${name} must be an integer from ${min} to ${max}, got ${describe(value)}`);
  }
  return value;
}

/**
 * An option group (module options, `consumer`, `queues['x']`, enqueue options, …): absent, or a
 * plain object whose keys are all `known` (when given), so a misspelt option fails at once
 * instead of being ignored. The message names the key, a near valid name if there is one,
 * and the valid names.
 */
export function assertOptionGroup<T extends object>(
  where: string,
  value: T | undefined,
  known?: readonly string[],
  error: ErrorClass = SqlQueueConfigError,
): T {
  if (value === undefined) return {} as T;
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    throw new error(`${where} must be an object, got ${describe(value)}`);
  }
  for (const key of Object.keys(value)) {
    if (known && !known.includes(key)) {
      const near = nearestName(key, known);
      throw new error(
        `${where}: unknown option '${key}'${near ? ` (did you mean '${near}'?)` : ''}; valid options: ${known.join(', ')}`,
      );
    }
  }
  return value;
}

/**
 * The valid name a misspelt one most likely meant: the same letters but for case, '_' and
 * '-', at most two edits away ('delay' → 'delayMs', 'maxAttempt' → 'maxAttempts'), or a
 * name it begins ('idempotency' → 'idempotencyKey').
 */
export function nearestName(name: string, candidates: readonly string[]): string | null {
  const plain = (text: string) => text.toLowerCase().replace(/[_-]/g, '');
  const wanted = plain(name);
  let best: { name: string | null; distance: number } = { name: null, distance: 3 };
  for (const candidate of candidates) {
    const other = plain(candidate);
    const distance =
      wanted.length >= 4 && (other.startsWith(wanted) || wanted.startsWith(other)) ? 0 : editDistance(wanted, other);
    // Two names equally near: no guess ('max' could be any of maxReaders, maxAttempts, …).
    if (distance === best.distance) best = { name: null, distance };
    else if (distance < best.distance) best = { name: candidate, distance };
  }
  return best.name;
}

/** Levenshtein distance with adjacent transpositions (optimal string alignment). */
function editDistance(a: string, b: string): number {
  const rows = Array.from({ length: a.length + 1 }, (_, i) => [i, ...new Array<number>(b.length).fill(0)]);
  for (let j = 1; j <= b.length; j++) rows[0]![j] = j;
  for (let i = 1; i <= a.length; i++) {
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      let d = Math.min(rows[i - 1]![j]! + 1, rows[i]![j - 1]! + 1, rows[i - 1]![j - 1]! + cost);
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) d = Math.min(d, rows[i - 2]![j - 2]! + 1);
      rows[i]![j] = d;
    }
  }
  return rows[a.length]![b.length]!;
}

export function assertBoolean(name: string, value: unknown): boolean {
  if (typeof value !== 'boolean') {
    throw new SqlQueueConfigError(`${name} must be true or false, got ${describe(value)}`);
  }
  return value;
}

/** Every option an enqueued job takes; a compile error reminds whoever adds one to EnqueueOptions. */
const ENQUEUE_OPTIONS: Record<keyof EnqueueOptions, true> = {
  idempotencyKey: true,
  runAt: true,
  delayMs: true,
  priority: true,
  groupKey: true,
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
  return {
    queue,
    payload: json,
    priority,
    runAt,
    delayMs,
    groupKey: optionalKey('groupKey', opts.groupKey, queue, at),
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
 * Queue settings checked and made one per queue (the last given wins), in queue order, so
 * processes recording at the same time lock the same rows in the same order.
 */
export function settingsByQueue(settings: readonly QueueSetting[]): Required<QueueSetting>[] {
  const byQueue = new Map<string, Required<QueueSetting>>();
  for (const setting of settings) {
    const queue = assertQueueName(setting.queue);
    const maxAttempts = assertInteger(
      `queue '${queue}' maxAttempts`,
      setting.maxAttempts,
      1,
      MAX_ATTEMPTS_LIMIT,
      SqlQueueValidationError,
    );
    const groupOnDead = setting.groupOnDead ?? 'continue';
    if (groupOnDead !== 'continue' && groupOnDead !== 'block') {
      throw new SqlQueueValidationError(
        `queue '${queue}' groupOnDead must be 'continue' or 'block', got ${describe(groupOnDead)}`,
      );
    }
    byQueue.set(queue, { queue, maxAttempts, groupOnDead });
  }
  return [...byQueue.keys()].sort().map((queue) => byQueue.get(queue)!);
}

/**
 * A \u0000 escape, or the escape JSON.stringify writes for an unpaired surrogate, in JSON text:
 * preceded by an even number of backslashes (none escaped it). jsonb refuses both.
 */
const UNSTORABLE_ESCAPE = /(?:^|[^\\])(?:\\\\)*\\u(?:0000|d[89a-f][0-9a-f]{2})/;
/** U+0000 or an unpaired surrogate in a string (node-postgres would turn the latter into U+FFFD). */
// eslint-disable-next-line no-control-regex -- finding U+0000 is the point
const UNSTORABLE_CHAR = /\u0000|[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;

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

/**
 * A group or idempotency key: 1 to 255 characters, storable as text in both dialects, no
 * trailing whitespace. `where` starts the message (`enqueue to 'orders'`), `name` names the option.
 */
export function assertKeyText(where: string, name: string, value: unknown): string {
  if (typeof value !== 'string' || value.length === 0 || value.length > KEY_MAX_LENGTH) {
    throw new SqlQueueValidationError(
      `${where}: ${name} must be a non-empty string of at most ${KEY_MAX_LENGTH} characters, got ${describe(value)}`,
    );
  }
  if (UNSTORABLE_CHAR.test(value)) {
    throw new SqlQueueValidationError(
      `${where}: ${name} contains U+0000 or an unpaired surrogate, which cannot be stored as text`,
    );
  }
  // SQL Server ignores trailing spaces when comparing strings: 'k' and 'k ' would be one key
  // there and two in PostgreSQL. Refusing them keeps both dialects identical.
  if (/\s$/.test(value)) {
    throw new SqlQueueValidationError(`${where}: ${name} must not end with whitespace, got ${describe(value)}`);
  }
  return value;
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

export function describe(value: unknown): string {
  if (typeof value === 'string') return `'${value.length > 60 ? `${value.slice(0, 60)}…` : value}'`;
  if (typeof value === 'bigint') return `${value}n`;
  if (value === null || typeof value !== 'object') return String(value);
  return Array.isArray(value) ? 'an array' : 'an object';
}
