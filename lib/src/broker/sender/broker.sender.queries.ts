import { assertInteger } from '../../core/validation.js';
import { MSSQL_KEY_LOCK_REFUSED } from '../../store/mssql/mssql.errors.js';
import { quoteMssqlIdentifier } from '../../store/mssql/mssql.identifiers.js';
import { MSSQL_CALLER_TRANSACTION_GONE } from '../../store/mssql/mssql.queries.js';
import { brokerStringLiteral, quoteBrokerObject } from '../broker.names.js';
import type { ResolvedBrokerQueue } from '../broker.types.js';

// The sender's and the initiator reader's T-SQL, one function per statement, SQL text only.
// Names are validated at resolve time and bracket-quoted here; every value is a parameter.
//
// Service Broker statements (SEND, BEGIN DIALOG, END CONVERSATION, RECEIVE, WAITFOR) that are not
// first in a batch follow a statement ended with ';' or a block keyword (BEGIN, TRY), as SEND,
// RECEIVE and END CONVERSATION on Microsoft Learn require.

/** SEND on an endpoint the target has ended: "not in a valid state for SEND" (state DI, ER, CD). */
export const MSSQL_SEND_STATE_ERROR = 8429;
/** The conversation handle is not found (the endpoint is gone). */
export const MSSQL_HANDLE_NOT_FOUND = 8426;
/** "not in a valid state for END CONVERSATION" (we ended it already). */
export const MSSQL_END_STATE_ERROR = 8427;

/** The errors after which a dialog is dead for sending: end our side, open a new one, send there. */
export const DIALOG_GONE_ERRORS: readonly number[] = [MSSQL_SEND_STATE_ERROR, MSSQL_HANDLE_NOT_FOUND];

function dialogs(schema: string): string {
  return `${quoteMssqlIdentifier(schema)}.[BrokerDialogs]`;
}

function outbox(schema: string): string {
  return `${quoteMssqlIdentifier(schema)}.[BrokerOutbox]`;
}

/**
 * The application-lock resource of one dialog key: the schema, queue and key hashed (SHA2_256;
 * schema and queue names cannot contain '/'), as 64 hex digits without 0x (CONVERT binary style
 * 2), under a prefix of its own: 88 characters, within sp_getapplock's nvarchar(255). The schema
 * is lower-cased because resource names are "binary compared" while schema names are not. A hash
 * collision only makes two keys' sends serialize; [DialogKey] compares in binary collation, so
 * equal keys always hash alike. The store's keyLockResource (mssql.queries.ts) with another
 * prefix, so a dialog key never shares a lock with an idempotency key of the same text.
 */
function dialogLockResource(schema: string, queue: string, dialogKey: string): string {
  return `N'nestjs-sql-queue:dialog:' + CONVERT(nvarchar(64), HASHBYTES('SHA2_256', CONCAT(N'${schema.toLowerCase()}/', ${queue}, N'/', ${dialogKey})), 2)`;
}

/**
 * The key's dialog row, read under the key's application lock, both held until the transaction
 * ends (the sender's own, or the caller's: every send runs inside driver.begin()).
 *
 * - The application lock (sp_getapplock, @LockOwner = 'Transaction') serializes the sends of one
 *   key, including two first sends: only one of them finds no row and begins a dialog. "When the
 *   lock_owner value is Transaction ... sp_getapplock must be executed from within a
 *   transaction", so the batch first refuses to run without one (a caller's transaction that an
 *   earlier error rolled back on the server; the send would otherwise commit on its own). The
 *   lock waits as any lock does (@@LOCK_TIMEOUT, else up to the request timeout). A result below
 *   0 is no lock (-1 timeout, -2 cancelled, -3 deadlock victim, -999 call error), and "a deadlock
 *   with an application lock does not roll back the transaction that requested the application
 *   lock", so it is thrown as the store's MSSQL_KEY_LOCK_REFUSED: a lock conflict, for the
 *   caller to roll back and retry
 *   (https://learn.microsoft.com/sql/relational-databases/system-stored-procedures/sp-getapplock-transact-sql).
 * - UPDLOCK on the row: a sender of the key holds it from this read to its SEND, so the initiator
 *   reader's settleEndedDialog, which writes the row without the application lock, waits for it
 *   (or reads past it) instead of ending the dialog under it.
 *
 * Why not UPDLOCK, HOLDLOCK, as before (review 2, R2-3): a serializable read of a missing key
 * locks the range up to the next existing key ("Singleton fetch of nonexistent data",
 * https://learn.microsoft.com/sql/relational-databases/sql-server-transaction-locking-and-row-versioning-guide),
 * with RangeS-U, which is incompatible with RangeS-U and RangeI-N. With rising group keys every
 * first send of a queue's new key fell in one gap, so it waited for the slowest open caller
 * transaction that had sent a first message, and two callers opening two new keys each in
 * crossing gaps deadlocked: the enqueue's C1/C2 (see keyedWork in mssql.queries.ts). The
 * application lock is on the key itself, so the read needs no range lock: no one inserts the
 * key's row without holding it except settleEndedDialog, which only replaces a row it holds.
 * (A caller's SERIALIZABLE transaction still takes the range: a table hint cannot lower it, and
 * "when UPDLOCK is specified, the READCOMMITTED and READCOMMITTEDLOCK isolation level hints are
 * ignored".)
 *
 * No READCOMMITTEDLOCK: the store's key check needs it because it is a plain read, which under
 * READ_COMMITTED_SNAPSHOT reads the last committed version instead of waiting for an uncommitted
 * change. This read is not: UPDLOCK "specifies that update locks are to be taken and held until
 * the transaction completes" (https://learn.microsoft.com/sql/t-sql/queries/hints-transact-sql-table),
 * also where READ_COMMITTED_SNAPSHOT is on, and a U lock waits for another transaction's X lock,
 * so it waits for settleEndedDialog's uncommitted delete or replacement of the row. The same page
 * says READCOMMITTEDLOCK is ignored beside UPDLOCK, so adding it would change nothing.
 *
 * Duplicates the store's takeKeyLock (mssql.queries.ts) with its own message; the two could share
 * one fragment. AgeMs comes from the database clock. Params: @queue, @dialogKey.
 */
export function lockDialog(schema: string): string {
  return `IF @@TRANCOUNT = 0
  THROW ${MSSQL_CALLER_TRANSACTION_GONE}, N'nestjs-sql-queue: a broker send runs in a transaction, but its connection has none (the caller''s transaction is no longer open on the server)', 1;
DECLARE @lock int, @refused nvarchar(2048), @resource nvarchar(255) = ${dialogLockResource(schema, '@queue', '@dialogKey')};
EXEC @lock = sys.sp_getapplock @Resource = @resource, @LockMode = 'Exclusive', @LockOwner = 'Transaction';
IF @lock < 0
BEGIN
  SET @refused = CONCAT(N'nestjs-sql-queue: dialog key lock not granted (sp_getapplock returned ', @lock, N')');
  THROW ${MSSQL_KEY_LOCK_REFUSED}, @refused, 1;
END;
SELECT [ConversationHandle], [State], DATEDIFF_BIG(millisecond, [CreatedAt], SYSUTCDATETIME()) AS [AgeMs]
FROM ${dialogs(schema)} WITH (UPDLOCK)
WHERE [Queue] = @queue AND [DialogKey] = @dialogKey;`;
}

/**
 * Begins a dialog for @dialogKey, sends the key's outbox in Id order on it and deletes those rows,
 * then sends @body unless it is NULL, and records the dialog as active. Expects @queue, @dialogKey
 * and @body to be parameters or declared; declares @dialog (the new handle), @sent, @rowId, @rowBody.
 *
 * No LIFETIME: BEGIN DIALOG's default is the largest int (seconds), so the dialog never expires
 * under us; it ends only through the close handshake or an error. ENCRYPTION = OFF: both services
 * live in this database, where messages are never encrypted, and ON would demand a database master
 * key for nothing.
 */
function openDialogAndFlush(schema: string, queue: ResolvedBrokerQueue): string {
  const messageType = quoteMssqlIdentifier(queue.messageType);
  return `DECLARE @dialog uniqueidentifier, @sent bigint = 0, @rowId bigint = 0, @rowBody varbinary(max);
BEGIN DIALOG CONVERSATION @dialog
  FROM SERVICE ${quoteMssqlIdentifier(queue.initiatorService)}
  TO SERVICE ${brokerStringLiteral(queue.service)}, N'CURRENT DATABASE'
  ON CONTRACT ${quoteMssqlIdentifier(queue.contract)}
  WITH ENCRYPTION = OFF;
${sendEachInIdOrder('@dialog', outbox(schema), '[Queue] = @queue AND [DialogKey] = @dialogKey', queue)}
DELETE FROM ${outbox(schema)} WHERE [Queue] = @queue AND [DialogKey] = @dialogKey AND [Id] <= @rowId;
IF @body IS NOT NULL
BEGIN
  SEND ON CONVERSATION @dialog MESSAGE TYPE ${messageType} (@body);
  SET @sent += 1;
END;
INSERT INTO ${dialogs(schema)} ([Queue], [DialogKey], [ConversationHandle], [State], [Sent])
VALUES (@queue, @dialogKey, @dialog, 'A', @sent);`;
}

/**
 * SENDs the rows of `source` matching `filter` on `handle`, one by one in Id order (a dialog keeps
 * the order of its SENDs). Expects @rowId bigint = 0, @rowBody varbinary(max) and @sent bigint
 * declared; leaves @rowId at the last row sent and counts @sent. A NULL body goes as an empty one
 * (SEND refuses NULL).
 */
function sendEachInIdOrder(handle: string, source: string, filter: string, queue: ResolvedBrokerQueue): string {
  return `WHILE 1 = 1
BEGIN
  SELECT TOP (1) @rowId = [Id], @rowBody = [MessageBody]
  FROM ${source}
  WHERE ${filter} AND [Id] > @rowId
  ORDER BY [Id];
  IF @@ROWCOUNT = 0 BREAK;
  SEND ON CONVERSATION ${handle} MESSAGE TYPE ${quoteMssqlIdentifier(queue.messageType)} (ISNULL(@rowBody, 0x));
  SET @sent += 1;
END;`;
}

/**
 * First send of a key (or the first after its dialog ended): a new dialog carrying the key's
 * waiting outbox rows, then this message. Params: @queue, @dialogKey, @body (varbinary).
 * Returns ConversationHandle, Sent.
 */
export function openDialog(schema: string, queue: ResolvedBrokerQueue): string {
  return `${openDialogAndFlush(schema, queue)}
SELECT @dialog AS [ConversationHandle], @sent AS [Sent];`;
}

/**
 * A SEND whose failure on a dead dialog (DIALOG_GONE_ERRORS) is caught and reported in @error
 * instead of failing the batch, so the sender can end that dialog and send on a new one in the
 * same transaction; any other error is thrown again. XACT_ABORT is off for this batch (a SET in
 * sp_executesql reverts when the batch ends), so a caught error leaves the transaction usable
 * unless the server doomed it anyway: callers read XACT_STATE() after it.
 */
function guardedSend(send: string, then: string): string {
  return `DECLARE @error int = 0;
SET XACT_ABORT OFF;
BEGIN TRY
  ${send}
${then}
END TRY
BEGIN CATCH
  SET @error = ERROR_NUMBER();
  IF @error NOT IN (${DIALOG_GONE_ERRORS.join(', ')}) THROW;
END CATCH;
SELECT @error AS [ErrorNumber], XACT_STATE() AS [XactState];`;
}

/**
 * SEND on the key's active dialog and count it. Params: @queue, @dialogKey, @handle, @body.
 * Returns ErrorNumber (0, or a DIALOG_GONE_ERRORS number) and XactState.
 */
export function sendOnDialog(schema: string, queue: ResolvedBrokerQueue): string {
  return guardedSend(
    `SEND ON CONVERSATION @handle MESSAGE TYPE ${quoteMssqlIdentifier(queue.messageType)} (@body);`,
    `  UPDATE ${dialogs(schema)} SET [Sent] = [Sent] + 1 WHERE [Queue] = @queue AND [DialogKey] = @dialogKey;`,
  );
}

/**
 * Starts the close handshake of an old dialog: our Close message goes on it (the target ends the
 * conversation when it reads it, after every message sent before), the row turns 'C' (closing),
 * and this message waits in the outbox until the initiator reader sees the target's EndDialog and
 * sends the outbox on a new dialog. Sending it on the old dialog now would be unsafe for nothing
 * (it would be delivered, but nothing can follow it there), and sending it on a new dialog now
 * would let the target run it beside the old dialog's last messages.
 * With @body NULL it only closes (the dead-message retry's dialog, after its last batch).
 * Params: @queue, @dialogKey, @handle, @messageType (nvarchar), @body. Returns ErrorNumber, XactState.
 */
export function closeDialog(schema: string, queue: ResolvedBrokerQueue): string {
  return guardedSend(
    `SEND ON CONVERSATION @handle MESSAGE TYPE ${quoteMssqlIdentifier(queue.closeMessageType)};`,
    `  UPDATE ${dialogs(schema)} SET [State] = 'C' WHERE [Queue] = @queue AND [DialogKey] = @dialogKey;
  IF @body IS NOT NULL
    INSERT INTO ${outbox(schema)} ([Queue], [DialogKey], [MessageTypeName], [MessageBody])
    VALUES (@queue, @dialogKey, @messageType, @body);`,
  );
}

/**
 * A send while the key's dialog is closing: the message waits in the outbox, in order.
 * Params: @queue, @dialogKey, @messageType, @body.
 */
export function enqueueOutbox(schema: string): string {
  return `INSERT INTO ${outbox(schema)} ([Queue], [DialogKey], [MessageTypeName], [MessageBody])
VALUES (@queue, @dialogKey, @messageType, @body);`;
}

/**
 * After a SEND found the key's dialog ended by the target: ends our side (a DI or ER endpoint
 * waits for it; one already ended or gone is fine) and forgets the row, so openDialog can begin a
 * new one. Ending our side also removes the target's EndDialog/Error from the initiator queue.
 * Params: @queue, @dialogKey, @handle. Returns XactState.
 */
export function forgetDialog(schema: string): string {
  return `DECLARE @error int = 0;
SET XACT_ABORT OFF;
BEGIN TRY
  END CONVERSATION @handle;
END TRY
BEGIN CATCH
  SET @error = ERROR_NUMBER();
  IF @error NOT IN (${MSSQL_HANDLE_NOT_FOUND}, ${MSSQL_END_STATE_ERROR}) THROW;
END CATCH;
DELETE FROM ${dialogs(schema)} WHERE [Queue] = @queue AND [DialogKey] = @dialogKey AND [ConversationHandle] = @handle;
SELECT XACT_STATE() AS [XactState];`;
}

// ---- The initiator queue's reader

/** Savepoint before the initiator's RECEIVE: rolling back to it returns the messages, and a commit then counts no rollback. */
export const INITIATOR_SAVEPOINT = 'sq_initiator';

/**
 * Sets the savepoint, then waits up to `timeoutMs` for the next EndDialog/Error messages on the
 * initiator queue (all of one conversation group: on our side each dialog is its own group). TOP
 * and TIMEOUT are validated integers written as literals (RECEIVE documents TIMEOUT as a number of
 * milliseconds; a literal needs no check that a variable is accepted there).
 */
export function receiveInitiator(queue: ResolvedBrokerQueue, top: number, timeoutMs: number): string {
  assertInteger('initiator receive TOP', top, 1, 1000);
  assertInteger('initiator receive timeout', timeoutMs, 0, 2_147_483_647);
  return `SAVE TRANSACTION ${INITIATOR_SAVEPOINT};
WAITFOR (
  RECEIVE TOP (${top}) conversation_handle, message_type_name, message_body
  FROM ${quoteBrokerObject(queue.initiatorQueue)}
), TIMEOUT ${timeoutMs};`;
}

/**
 * Returns what the transaction received to the initiator queue, after our own statement failed;
 * the transaction then commits (a full rollback would count toward the queue's poison limit).
 */
export function giveBackInitiatorMessages(): string {
  return `ROLLBACK TRANSACTION ${INITIATOR_SAVEPOINT};`;
}

/**
 * The initiator's side of a dialog the target ended (EndDialog, or Error): ends our side, forgets
 * the dialog row, and when sends wait in the outbox for its key, opens a new dialog and sends them
 * in order, in this transaction.
 *
 * Deadlock-free against senders: this transaction already holds the dialog's conversation group
 * (RECEIVE locked it), and a sender holds the key's row before it SENDs (which waits for that
 * group). So the row is taken without waiting when it is active ('A', READPAST): a sender holding
 * it is about to SEND on this dialog, will get 8429 once we commit, and ends and replaces the
 * dialog itself. A closing row ('C') is waited for: its senders only write the outbox, never SEND
 * on the dialog. The state is read first without locks only to choose; the decisive read locks.
 * It takes the row's U lock (a sender of the key holds it from lockDialog to its SEND or outbox
 * write) but not the key's application lock: a sender that waits for that U lock already holds
 * the application lock, so taking it here would close a cycle. No HOLDLOCK on the closing read
 * (review 2, R2-3): it seeks UX_BrokerDialogs_Handle for a row the NOLOCK read just saw, and a
 * range lock would matter only if that row had gone meanwhile, when it would lock the gap up to
 * the next handle and make every new dialog whose random handle falls there wait for this
 * transaction. It would protect nothing: a handle is never inserted again once its conversation
 * has ended, and UPDLOCK alone already waits for the sender holding the row.
 * Params: @queue, @handle. Returns DialogKey (NULL: not ours, or left to its sender), State,
 * NewHandle (NULL unless the outbox was flushed), Flushed.
 */
export function settleEndedDialog(schema: string, queue: ResolvedBrokerQueue): string {
  return `DECLARE @dialogKey nvarchar(300), @state char(1), @body varbinary(max) = NULL, @flushed bigint = 0, @newHandle uniqueidentifier;
SELECT @state = [State] FROM ${dialogs(schema)} WITH (NOLOCK) WHERE [ConversationHandle] = @handle;
IF @state = 'C'
  SELECT @dialogKey = [DialogKey], @state = [State]
  FROM ${dialogs(schema)} WITH (UPDLOCK)
  WHERE [ConversationHandle] = @handle;
ELSE
  SELECT @dialogKey = [DialogKey], @state = [State]
  FROM ${dialogs(schema)} WITH (UPDLOCK, READPAST, READCOMMITTEDLOCK)
  WHERE [ConversationHandle] = @handle;
END CONVERSATION @handle;
IF @dialogKey IS NOT NULL
BEGIN
  DELETE FROM ${dialogs(schema)} WHERE [Queue] = @queue AND [DialogKey] = @dialogKey AND [ConversationHandle] = @handle;
  IF EXISTS (SELECT 1 FROM ${outbox(schema)} WHERE [Queue] = @queue AND [DialogKey] = @dialogKey)
  BEGIN
${indent(openDialogAndFlush(schema, queue), '    ')}
    SELECT @newHandle = @dialog, @flushed = @sent;
  END;
END;
SELECT @dialogKey AS [DialogKey], @state AS [State], @newHandle AS [NewHandle], @flushed AS [Flushed];`;
}

function indent(text: string, by: string): string {
  return text
    .split('\n')
    .map((line) => by + line)
    .join('\n');
}
