import { SqlQueueConfigError, SqlQueueValidationError } from './errors.js';
import type { QueueSetting } from './types.js';

/** Queue names: what both dialects' identifiers and the SQL enqueue function accept alike. */
export const QUEUE_NAME_PATTERN = '^[A-Za-z0-9._-]{1,128}$';
const QUEUE_NAME = new RegExp(QUEUE_NAME_PATTERN);
// Lowest common denominator of PostgreSQL (63 bytes) and SQL Server identifiers, ASCII only,
// so the same name is valid, unambiguous and safe to quote in both dialects.
const SCHEMA_NAME = /^[A-Za-z_][A-Za-z0-9_]{0,62}$/;
export const KEY_MAX_LENGTH = 255;
/**
 * The characters JavaScript's \s matches (a key may not end with one): spelt out for the SQL
 * enqueue function and procedure, which refuse the same keys.
 */
export const WHITESPACE_CODE_POINTS: readonly number[] = [
  0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x20, 0xa0, 0x1680, 0x2000, 0x2001, 0x2002, 0x2003, 0x2004, 0x2005, 0x2006, 0x2007,
  0x2008, 0x2009, 0x200a, 0x2028, 0x2029, 0x202f, 0x205f, 0x3000, 0xfeff,
];
export const DAY_MS = 86_400_000;
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
    byQueue.set(queue, { queue, maxAttempts, groupOnDead, limits: setting.limits ?? null });
  }
  return [...byQueue.keys()].sort().map((queue) => byQueue.get(queue)!);
}

/** U+0000 or an unpaired surrogate in a string (node-postgres would turn the latter into U+FFFD). */
// eslint-disable-next-line no-control-regex -- finding U+0000 is the point
const UNSTORABLE_CHAR = /\u0000|[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;

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

/** The most characters of an operator's reason (a pause's, a cancellation's), as the columns hold. */
export const REASON_MAX_LENGTH = 1_000;

/** An operator's reason (`{ reason }` of pauseQueue): absent (null), or text of at most REASON_MAX_LENGTH characters. */
export function assertReason(where: string, value: unknown): string | null {
  if (value === undefined || value === null) return null;
  if (typeof value !== 'string' || value.length > REASON_MAX_LENGTH) {
    throw new SqlQueueValidationError(
      `${where}: reason must be a string of at most ${REASON_MAX_LENGTH} characters, got ${describe(value)}`,
    );
  }
  if (UNSTORABLE_CHAR.test(value)) {
    throw new SqlQueueValidationError(
      `${where}: reason contains U+0000 or an unpaired surrogate, which cannot be stored as text`,
    );
  }
  return value;
}

export function describe(value: unknown): string {
  if (typeof value === 'string') return `'${value.length > 60 ? `${value.slice(0, 60)}…` : value}'`;
  if (typeof value === 'bigint') return `${value}n`;
  if (value === null || typeof value !== 'object') return String(value);
  return Array.isArray(value) ? 'an array' : 'an object';
}

const PRINCIPAL = /^[A-Za-z0-9_.@\\ -]{1,128}$/;

/**
 * A database principal a grants script names (a user, a role, `DOMAIN\\user`): letters, digits,
 * '_', '.', '@', '\\', '-' and inner spaces, 1 to 128 characters; quoted by the dialect after.
 */
export function assertPrincipalName(role: string, value: unknown): string {
  if (typeof value !== 'string' || !PRINCIPAL.test(value) || value.trim() !== value) {
    throw new SqlQueueConfigError(
      `the database principal for ${role} ${describe(value)} is invalid: use letters, digits, '_', '.', '@', '\\', '-' or inner spaces (1 to 128 characters)`,
    );
  }
  return value;
}
