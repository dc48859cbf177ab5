/** Deadlock victim: the server rolled the statement (and any transaction) back. */
export const MSSQL_DEADLOCK = 1205;
/** Lock request time out (only with SET LOCK_TIMEOUT). */
export const MSSQL_LOCK_TIMEOUT = 1222;
/**
 * "Could not continue scan with NOLOCK due to data movement": a READUNCOMMITTED read (complete,
 * fail, release, reap, the group claim and the repair sweep read Jobs that way) lost its place.
 * Table hints, READUNCOMMITTED: "resolve it as you would a deadlock error (error message 1205),
 * and retry your statement" (https://learn.microsoft.com/sql/t-sql/queries/hints-transact-sql-table).
 */
export const MSSQL_NOLOCK_DATA_MOVEMENT = 601;

/**
 * THROWn by enqueue when sp_getapplock does not grant an idempotency key's lock (timeout,
 * deadlock victim): a deadlock or lock timeout by another name (mssql.queries.ts, takeKeyLock).
 */
export const MSSQL_KEY_LOCK_REFUSED = 51003;

/**
 * Retryable in place: the statement was rolled back whole, so repeating it is safe (in a
 * caller's transaction the store rethrows instead; after a refused key lock that transaction is
 * still open only if the caller's session has XACT_ABORT off: "The THROW statement honors SET
 * XACT_ABORT", so with it on the transaction is doomed and rolled back; either way it is the
 * caller's to roll back and retry).
 */
const LOCK_CONFLICTS = new Set([
  MSSQL_DEADLOCK,
  MSSQL_LOCK_TIMEOUT,
  MSSQL_KEY_LOCK_REFUSED,
  MSSQL_NOLOCK_DATA_MOVEMENT,
]);

/**
 * Connection-level and Azure SQL throttling errors after which the next attempt may succeed:
 * 4060 cannot open database, 40197/40501/40613/49918-49920 service busy or reconfiguring,
 * 10928/10929 resource limits, 233/10053/10054/10060/64 transport failures.
 */
const TRANSIENT_NUMBERS = new Set([
  ...LOCK_CONFLICTS,
  4060,
  40197,
  40501,
  40613,
  49918,
  49919,
  49920,
  10928,
  10929,
  233,
  10053,
  10054,
  10060,
  64,
  -2,
]);

const TRANSIENT_CODES = new Set(['ETIMEOUT', 'ESOCKET', 'ECONNCLOSED', 'ECONNRESET', 'ECONNREFUSED', 'ENOTOPEN']);

/** The SQL Server error number of a failed request (mssql wraps tedious's error), if any. */
export function errorNumber(error: unknown): number | undefined {
  if (!error || typeof error !== 'object') return undefined;
  const candidate = error as { number?: unknown; originalError?: { number?: unknown; info?: { number?: unknown } } };
  const value = candidate.number ?? candidate.originalError?.info?.number ?? candidate.originalError?.number;
  return typeof value === 'number' ? value : undefined;
}

export function isLockConflict(error: unknown): boolean {
  const number = errorNumber(error);
  return number !== undefined && LOCK_CONFLICTS.has(number);
}

/** Errors the server reports when the connection or the service fails: the outcome is unknown. */
const CONNECTION_NUMBERS = new Set([
  4060, 40197, 40501, 40613, 49918, 49919, 49920, 10928, 10929, 233, 10053, 10054, 10060, 64,
]);

/**
 * An error the server raised while running the batch (a positive error number below severity
 * 20, which would end the connection): the store's batches are atomic (XACT_ABORT ON in their
 * own transaction), so it stored nothing. mssql gives client-side failures (timeouts, a closed
 * connection) a string code instead of a number: their outcome is unknown.
 */
export function isMssqlRefusal(error: unknown): boolean {
  const number = errorNumber(error);
  if (number === undefined || number <= 0 || CONNECTION_NUMBERS.has(number)) return false;
  const candidate = error as { class?: unknown; originalError?: { info?: { class?: unknown } } };
  const severity = candidate.class ?? candidate.originalError?.info?.class;
  return typeof severity !== 'number' || severity < 20;
}

export function isTransientMssqlError(error: unknown): boolean {
  const number = errorNumber(error);
  if (number !== undefined && TRANSIENT_NUMBERS.has(number)) return true;
  const code = (error as { code?: unknown } | null)?.code;
  return typeof code === 'string' && TRANSIENT_CODES.has(code);
}
