// Fragments more than one capability's statements use: times, id reservation, job columns, hints.
import { MSSQL_KEY_LOCK_REFUSED } from '../mssql.errors.js';

/** `now` (SYSUTCDATETIME() by default) moved by a bigint count of milliseconds (sign: +1 future, -1 past). */
export function shiftedNow(param: string, sign: 1 | -1, now = 'SYSUTCDATETIME()'): string {
  const op = sign === 1 ? '' : '-';
  return `DATEADD(millisecond, ${op}CAST(${param} % 1000 AS int), DATEADD(second, ${op}CAST(${param} / 1000 AS int), ${now}))`;
}

/**
 * The hints of every READPAST claim (claim, reaper), exactly the seed's. UPDLOCK makes the read
 * a locking one and keeps the rows to the end of the statement; READPAST skips rows another
 * claimer holds; READCOMMITTEDLOCK is there because "the READPAST table hint can't be specified
 * when the READ_COMMITTED_SNAPSHOT database option is set to ON and ... the transaction
 * isolation level of the session is READ COMMITTED ... include the READCOMMITTEDLOCK table
 * hint" (its own locking is moot: "when UPDLOCK is specified, the READCOMMITTED and
 * READCOMMITTEDLOCK isolation level hints are ignored").
 * No ROWLOCK here: the same page says "SQL Server doesn't allow for more than one table hint
 * from each of the following groups ... Granularity hints: PAGLOCK, NOLOCK, READCOMMITTEDLOCK,
 * ROWLOCK, TABLOCK, or TABLOCKX" (https://learn.microsoft.com/sql/t-sql/queries/hints-transact-sql-table).
 * NServiceBus's SQL transport (PR #1277/#1278) and Orleans (PR #10505) do ship
 * (UPDLOCK, READPAST, ROWLOCK, READCOMMITTEDLOCK), so the engine accepts it in practice, but
 * that is undocumented behaviour; the documented form is the seed's. Every other statement that
 * writes Jobs or Attempts carries ROWLOCK (no other granularity hint).
 */
export const CLAIM_HINTS = 'UPDLOCK, READPAST, READCOMMITTEDLOCK';

/**
 * One idempotency key's lock, held by the transaction until it commits or rolls back
 * (https://learn.microsoft.com/sql/relational-databases/system-stored-procedures/sp-getapplock-transact-sql:
 * "When the lock_owner value is Transaction ... sp_getapplock must be executed from within a
 * transaction"). It waits as any lock does (@@LOCK_TIMEOUT, else up to the request timeout). A
 * result below 0 is no lock (-1 timeout, -2 cancelled, -3 deadlock victim, -999 call error),
 * and "a deadlock with an application lock does not roll back the transaction that requested
 * the application lock", so it is thrown: keyedWork rolls back its own transaction, and a
 * caller's stays the caller's to roll back (doomed already if the caller's session has
 * XACT_ABORT on: "The THROW statement honors SET XACT_ABORT",
 * https://learn.microsoft.com/sql/t-sql/statements/set-xact-abort-transact-sql).
 */
export function takeKeyLock(indent: string, what = 'idempotency key'): string {
  return `${indent}EXEC @lock = sys.sp_getapplock @Resource = @resource, @LockMode = 'Exclusive', @LockOwner = 'Transaction';
${indent}IF @lock < 0
${indent}BEGIN
${indent}  SET @refused = CONCAT(N'nestjs-sql-queue: ${what} lock not granted (sp_getapplock returned ', @lock, N')');
${indent}  THROW ${MSSQL_KEY_LOCK_REFUSED}, @refused, 1;
${indent}END;`;
}

/**
 * True when `queue` is paused: a seek on PK_QueuePauses. READPAST, as the claims read: a pause or
 * resume not committed yet is not seen, and nothing waits on it.
 */
export function isPaused(pauses: string, queue: string): string {
  return `EXISTS (SELECT 1 FROM ${pauses} WITH (READPAST, READCOMMITTEDLOCK) WHERE [Queue] = ${queue})`;
}

/** The queue's consumers recorded flow limits (alias s: its QueueSettings row). */
export const HAS_LIMITS = `(s.[GlobalConcurrency] IS NOT NULL OR s.[ConcurrencyPerKey] IS NOT NULL OR s.[RateMax] IS NOT NULL
  OR s.[KeyRateMax] IS NOT NULL)`;

/**
 * Ready jobs without a group or key (IX_Jobs_Claim) and ready keyed ones (IX_Jobs_KeyReady, from
 * version 15): each predicate names its filtered index's own, so a read of either is a seek.
 */
export const READY_UNKEYED = "[State] = 'ready' AND [GroupKey] IS NULL AND [ConcurrencyKey] IS NULL";
export const READY_KEYED = "[State] = 'ready' AND [ConcurrencyKey] IS NOT NULL";
