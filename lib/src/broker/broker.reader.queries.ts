import { quoteMssqlIdentifier } from '../store/mssql/mssql.identifiers.js';
import { quoteBrokerObject } from './broker.names.js';
import type { BrokerObjectName } from './broker.types.js';

// The reader's statements (broker.reader.ts): one statement, one function returning SQL text.
// Names are validated and bracket-quoted; every value is a bound parameter. A Service Broker
// statement that is not first in its batch follows a statement ended by ';' (RECEIVE, GET
// CONVERSATION GROUP and END CONVERSATION require it).
//
// Transactions: the reader runs one transaction per runOnce() on its own connection
// (XACT_ABORT OFF): waitForGroup, then per message saveMessage → receive → … The journal
// statements (journalAttempt, journalFailure, journalRelease) are autocommit batches on the
// shared pool instead, so what they record survives a rollback of the reader's transaction.
// forgetMessage, deadLetter and drainConversationToDead run inside the reader's transaction.
//
// Journal locking: no HOLDLOCK/SERIALIZABLE on BrokerAttempts. Only the reader holding a
// message's conversation group touches its row (Service Broker's group lock serializes that),
// and a key-range lock taken by one reader's journal batch could wait on a row another
// reader's open transaction deleted, while that reader waits on its own journal batch: a
// deadlock across connections that SQL Server cannot see. Equality seeks on the primary key
// lock only the row they find.

/** The savepoint each message is received under (savepoint names: at most 32 characters). */
export const BROKER_MESSAGE_SAVEPOINT = 'sq_message';

/** END CONVERSATION … WITH ERROR code of a conversation whose message went to the dead table (> 0: user codes). */
export const BROKER_DEAD_LETTER_ERROR_CODE = 50_001;

/** The columns every RECEIVE of the reader returns, in this order (the drain's table variable matches it). */
const RECEIVED_COLUMNS =
  'conversation_group_id, conversation_handle, message_sequence_number, message_type_name, message_body';

/** A received message as RECEIVE returns it (bigint as a decimal string, uniqueidentifier as text). */
export interface BrokerReceivedRow {
  conversation_group_id: string;
  conversation_handle: string;
  message_sequence_number: string | number;
  message_type_name: string;
  message_body: Buffer | null;
}

/** journalAttempt's row. */
export interface BrokerJournalRow {
  /** Runs started, this one included when Journaled is 1. */
  Attempts: number;
  /** Runs that ended in a recorded handler failure. */
  Failures: number;
  LastError: string | null;
  /** 1: this run was counted; 0: the message is not due (RetryAt in the future) and nothing changed. */
  Journaled: boolean | number;
  /** Milliseconds until RetryAt on the database clock; 0 when due. */
  RetryInMs: string | number;
}

/**
 * Waits up to @timeoutMs (int) for a conversation group with messages and locks it for the
 * transaction; one row, conversation_group_id NULL when the wait timed out. The DECLARE emits
 * nothing, so no result reaches the driver before the WAITFOR returns (the driver's request
 * timer, above the WAITFOR timeout, keeps running until then).
 */
export function waitForGroup(queue: BrokerObjectName): string {
  return `DECLARE @group uniqueidentifier;
WAITFOR (GET CONVERSATION GROUP @group FROM ${quoteBrokerObject(queue)}), TIMEOUT @timeoutMs;
SELECT @group AS conversation_group_id;`;
}

/** Before each RECEIVE: a failure rolls back to here, which returns that message only and keeps the group lock. */
export function saveMessage(): string {
  return `SAVE TRANSACTION ${BROKER_MESSAGE_SAVEPOINT};`;
}

/** Returns the message received since saveMessage to the queue; the group stays locked (it was locked before). */
export function rollbackMessage(): string {
  return `ROLLBACK TRANSACTION ${BROKER_MESSAGE_SAVEPOINT};`;
}

/**
 * The next message of the locked group @group (uniqueidentifier), no WAITFOR: the group has
 * messages or is done. TOP (1): a rollback to the savepoint returns everything received after
 * it, so one message per savepoint is what lets earlier successes commit. The body is read as
 * bytes for every format and decoded in Node: a server-side CAST that failed on a malformed
 * body would fail this RECEIVE every time, and the message could never be received to be
 * dead-lettered.
 */
export function receiveFromGroup(queue: BrokerObjectName): string {
  return `RECEIVE TOP (1) ${RECEIVED_COLUMNS} FROM ${quoteBrokerObject(queue)} WHERE conversation_group_id = @group;`;
}

/** Ends our side of conversation @handle (uniqueidentifier): EndDialog, Error and Close received. */
export function endConversation(): string {
  return 'END CONVERSATION @handle;';
}

/**
 * Counts a handler run before it starts (autocommit, shared pool), unless the message is not
 * due yet. Params: @queue nvarchar (the broker queue's name), @handle uniqueidentifier,
 * @sequence bigint, @workerId nvarchar. One row: BrokerJournalRow.
 *
 * The row is created (Attempts 0) if missing, then counted only when RetryAt has passed; a
 * message received before its retry is due gets its row back unchanged with the wait left.
 * Two statements, each atomic: a crash between them leaves Attempts 0, which the next run
 * counts as its first.
 */
export function journalAttempt(schema: string): string {
  const attempts = `${quoteMssqlIdentifier(schema)}.[BrokerAttempts]`;
  return `DECLARE @now datetime2(3) = SYSUTCDATETIME();
DECLARE @journal TABLE (
  [Attempts] int NOT NULL,
  [Failures] int NOT NULL,
  [LastError] nvarchar(max) NULL,
  [RetryAt] datetime2(3) NULL,
  [Journaled] bit NOT NULL
);
INSERT INTO ${attempts} ([Queue], [ConversationHandle], [MessageSequenceNumber], [Attempts], [Failures], [FirstAttemptAt], [LastAttemptAt], [WorkerId])
SELECT @queue, @handle, @sequence, 0, 0, @now, @now, @workerId
WHERE NOT EXISTS (
  SELECT 1 FROM ${attempts} WHERE [ConversationHandle] = @handle AND [MessageSequenceNumber] = @sequence
);
UPDATE ${attempts}
SET [Attempts] = [Attempts] + 1, [LastAttemptAt] = @now, [WorkerId] = @workerId
OUTPUT inserted.[Attempts], inserted.[Failures], inserted.[LastError], inserted.[RetryAt], CAST(1 AS bit) INTO @journal
WHERE [ConversationHandle] = @handle AND [MessageSequenceNumber] = @sequence AND ([RetryAt] IS NULL OR [RetryAt] <= @now);
IF @@ROWCOUNT = 0
  INSERT INTO @journal ([Attempts], [Failures], [LastError], [RetryAt], [Journaled])
  SELECT [Attempts], [Failures], [LastError], [RetryAt], CAST(0 AS bit)
  FROM ${attempts} WHERE [ConversationHandle] = @handle AND [MessageSequenceNumber] = @sequence;
SELECT [Attempts], [Failures], [LastError], [Journaled],
  CASE WHEN [Journaled] = 0 AND [RetryAt] > @now THEN DATEDIFF_BIG(millisecond, @now, [RetryAt]) ELSE CAST(0 AS bigint) END AS [RetryInMs]
FROM @journal;`;
}

/**
 * Records a run that ended in a handler error, after the message went back to the queue
 * (autocommit, shared pool): it is not due again before @delayMs (int) on the database clock.
 * Params: @handle, @sequence, @error nvarchar, @delayMs int.
 */
export function journalFailure(schema: string): string {
  return `UPDATE ${quoteMssqlIdentifier(schema)}.[BrokerAttempts]
SET [Failures] = [Failures] + 1, [LastError] = @error, [RetryAt] = DATEADD(millisecond, @delayMs, SYSUTCDATETIME())
WHERE [ConversationHandle] = @handle AND [MessageSequenceNumber] = @sequence;`;
}

/**
 * Gives a run back (autocommit, shared pool): the application stopped and aborted the handler,
 * which is neither the message's failure nor a crash. Params: @handle, @sequence.
 */
export function journalRelease(schema: string): string {
  return `UPDATE ${quoteMssqlIdentifier(schema)}.[BrokerAttempts]
SET [Attempts] = [Attempts] - 1
WHERE [ConversationHandle] = @handle AND [MessageSequenceNumber] = @sequence AND [Attempts] > 0;`;
}

/**
 * Journal rows left behind (autocommit, shared pool, batches of 1,000): a run that never recorded
 * an outcome and whose conversation then ended elsewhere (the other side ended it, an
 * administrator cleaned it up) leaves its row, as nothing receives that message again. A row of
 * broker queue @queue untouched for a day is such a row when its conversation endpoint is gone or
 * closed AND its message is no longer in the queue: the second test keeps live rows even where
 * catalog visibility hides endpoints from the sweeping login (reading the queue needs the
 * RECEIVE its readers hold). Returns [Deleted].
 */
export function sweepOrphanedAttempts(schema: string, queue: BrokerObjectName): string {
  return `DELETE TOP (1000) a
FROM ${quoteMssqlIdentifier(schema)}.[BrokerAttempts] AS a
WHERE a.[Queue] = @queue
  AND a.[LastAttemptAt] < DATEADD(day, -1, SYSUTCDATETIME())
  AND NOT EXISTS (
    SELECT 1 FROM sys.conversation_endpoints AS e
    WHERE e.conversation_handle = a.[ConversationHandle] AND e.state <> 'CD'
  )
  AND NOT EXISTS (
    SELECT 1 FROM ${quoteBrokerObject(queue)} WITH (NOLOCK)
    WHERE conversation_handle = a.[ConversationHandle] AND message_sequence_number = a.[MessageSequenceNumber]
  );
SELECT @@ROWCOUNT AS [Deleted];`;
}

/** The message was handled: its journal row goes with it (reader's transaction). Params: @handle, @sequence. */
export function forgetMessage(schema: string): string {
  return `DELETE FROM ${quoteMssqlIdentifier(schema)}.[BrokerAttempts]
WHERE [ConversationHandle] = @handle AND [MessageSequenceNumber] = @sequence;`;
}

/**
 * Moves the message received under the current savepoint to the dead table (reader's
 * transaction; committing removes it from the queue). Params: @queue nvarchar, @handle,
 * @group uniqueidentifier, @sequence bigint, @messageType nvarchar, @body varbinary (NULL for
 * none), @attempts int, @crashes int, @lastError nvarchar (NULL), @reason nvarchar.
 */
export function deadLetter(schema: string): string {
  const s = quoteMssqlIdentifier(schema);
  return `INSERT INTO ${s}.[BrokerDead] ([Queue], [ConversationHandle], [ConversationGroupId], [MessageSequenceNumber], [MessageTypeName], [MessageBody], [Attempts], [Crashes], [LastError], [Reason])
VALUES (@queue, @handle, @group, @sequence, @messageType, @body, @attempts, @crashes, @lastError, @reason);
DELETE FROM ${s}.[BrokerAttempts] WHERE [ConversationHandle] = @handle AND [MessageSequenceNumber] = @sequence;`;
}

/**
 * After deadLetter: ends conversation @handle with an error, keeping its queued messages.
 * END CONVERSATION removes a conversation's messages from the queue, so the rest are received
 * first and kept in the dead table as 'conversation-ended' (only @messageType: the
 * application's messages; a Close or EndDialog behind them means nothing once the conversation
 * is gone). Their journal rows go too. Params: @queue, @handle, @messageType, @code int (> 0),
 * @description nvarchar (at most 3000 characters). One row: [Moved], the messages kept.
 */
export function drainConversationToDead(schema: string, queue: BrokerObjectName): string {
  const s = quoteMssqlIdentifier(schema);
  return `DECLARE @rest TABLE (
  conversation_group_id uniqueidentifier NOT NULL,
  conversation_handle uniqueidentifier NOT NULL,
  message_sequence_number bigint NOT NULL,
  message_type_name nvarchar(256) NOT NULL,
  message_body varbinary(max) NULL
);
RECEIVE ${RECEIVED_COLUMNS} FROM ${quoteBrokerObject(queue)} INTO @rest WHERE conversation_handle = @handle;
INSERT INTO ${s}.[BrokerDead] ([Queue], [ConversationHandle], [ConversationGroupId], [MessageSequenceNumber], [MessageTypeName], [MessageBody], [Attempts], [Crashes], [LastError], [Reason])
SELECT @queue, r.conversation_handle, r.conversation_group_id, r.message_sequence_number, r.message_type_name, r.message_body, 0, 0, NULL, 'conversation-ended'
FROM @rest AS r
WHERE r.message_type_name = @messageType
ORDER BY r.message_sequence_number;
DELETE FROM ${s}.[BrokerAttempts] WHERE [ConversationHandle] = @handle;
END CONVERSATION @handle WITH ERROR = @code DESCRIPTION = @description;
SELECT COUNT(*) AS [Moved] FROM @rest WHERE message_type_name = @messageType;`;
}
