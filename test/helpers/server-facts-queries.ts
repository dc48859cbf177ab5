import { quoteBrokerObject } from '../../lib/src/broker/broker.names.js';
import { RECEIVED_TABLE } from '../../lib/src/broker/reader/broker.receiver.queries.js';
import type { BrokerObjectName, ResolvedBrokerQueue } from '../../lib/src/broker/broker.types.js';
import { assertInteger } from '../../lib/src/core/validation.js';
import { quoteMssqlIdentifier } from '../../lib/src/store/mssql/mssql.identifiers.js';

/**
 * The T-SQL that test/integration/mssql/server-facts.mssql.spec.ts sends itself, one function
 * each (review 2, "Facts only a real server can settle", and the Service Broker redesign's own
 * assumptions). The statements the library sends (moveMessages, waitForMessages, lockDialog,
 * readBrokerQueueLocks, …) are taken from lib/src as they are, never copied here. Values are
 * parameters; only names the library validated (schema, queue, message type) are spliced in,
 * bracket-quoted, and integers only after assertInteger.
 *
 * Every page cited below is Microsoft Learn (the MicrosoftDocs/sql-docs sources).
 */

const TIMEOUT_MAX_MS = 60_000;

function lockTimeout(ms: number): string {
  return `SET LOCK_TIMEOUT ${assertInteger('lock timeout', ms, 0, TIMEOUT_MAX_MS)};`;
}

/**
 * `text` with a lock timeout in front: a statement that would wait longer for a lock fails with
 * 1222 instead ("SET LOCK_TIMEOUT … specifies the number of milliseconds a statement waits for a
 * lock to be released", https://learn.microsoft.com/sql/t-sql/statements/set-lock-timeout-transact-sql).
 * Inside sp_executesql the setting ends with the batch.
 */
export function withLockTimeout(ms: number, text: string): string {
  return `${lockTimeout(ms)}\n${text}`;
}

/**
 * The permissions some facts need: VIEW SERVER STATE to read other sessions' locks
 * (https://learn.microsoft.com/sql/relational-databases/system-dynamic-management-views/sys-dm-tran-locks-transact-sql),
 * ALTER ANY CONNECTION to KILL a session
 * (https://learn.microsoft.com/sql/t-sql/language-elements/kill-transact-sql).
 */
export const SERVER_PERMISSIONS = `SELECT HAS_PERMS_BY_NAME(NULL, NULL, N'VIEW SERVER STATE') AS [ViewServerState],
  HAS_PERMS_BY_NAME(NULL, NULL, N'ALTER ANY CONNECTION') AS [AlterAnyConnection];`;

/**
 * Turns Service Broker's own poison-message handling on for a scratch queue (ours are created
 * OFF): "A queue that has poison message handling set to OFF will not be disabled after five
 * consecutive transaction rollbacks" (https://learn.microsoft.com/sql/t-sql/statements/alter-queue-transact-sql).
 */
export function enablePoisonHandling(queue: BrokerObjectName): string {
  return `ALTER QUEUE ${quoteBrokerObject(queue)} WITH POISON_MESSAGE_HANDLING (STATUS = ON);`;
}

/** A queue's receive status and poison-message setting; @queue is its quoted two-part name. */
export const QUEUE_FLAGS = `SELECT CAST(q.[is_receive_enabled] AS int) AS [ReceiveEnabled],
  CAST(q.[is_poison_message_handling_enabled] AS int) AS [PoisonHandling]
FROM sys.service_queues AS q
WHERE q.[object_id] = OBJECT_ID(@queue);`;

/** One more message of the queue's type on dialog @handle (@body varbinary). */
export function sendOnConversation(queue: ResolvedBrokerQueue): string {
  return `SEND ON CONVERSATION @handle MESSAGE TYPE ${quoteMssqlIdentifier(queue.messageType)} (@body);`;
}

/**
 * The next message of any conversation group this session can lock (RECEIVE without WHERE: "If
 * there is no WHERE clause, RECEIVE determines which conversation group … has not been locked by
 * another RECEIVE statement", https://learn.microsoft.com/sql/t-sql/statements/receive-transact-sql).
 */
export function receiveNext(queue: BrokerObjectName): string {
  return `RECEIVE TOP (1) CAST([conversation_handle] AS nvarchar(36)) AS [Handle],
  CAST([conversation_group_id] AS nvarchar(36)) AS [GroupId], [message_type_name] AS [Type],
  [message_sequence_number] AS [Sequence]
FROM ${quoteBrokerObject(queue)};`;
}

/** Every message of conversation group @group, in sequence order. */
export function receiveOfGroup(queue: BrokerObjectName): string {
  return `RECEIVE CAST([conversation_handle] AS nvarchar(36)) AS [Handle],
  CAST([conversation_group_id] AS nvarchar(36)) AS [GroupId], [message_type_name] AS [Type],
  [message_sequence_number] AS [Sequence]
FROM ${quoteBrokerObject(queue)}
WHERE conversation_group_id = @group;`;
}

/** The messages ready to receive (status 1), read WITH (NOLOCK) as "Querying Queues" advises. */
export function readyMessages(queue: BrokerObjectName): string {
  return `SELECT COUNT(*) AS [Messages] FROM ${quoteBrokerObject(queue)} WITH (NOLOCK) WHERE [status] = 1;`;
}

/** Every message of conversation @handle still in the queue, whatever its status. */
export function messagesOfConversation(queue: BrokerObjectName): string {
  return `SELECT COUNT(*) AS [Messages] FROM ${quoteBrokerObject(queue)} WITH (NOLOCK) WHERE [conversation_handle] = @handle;`;
}

/**
 * The locks on queue @queue ('[schema].[name]') as the lock manager lists them, with the session
 * and its command (a background task's too: the poison-message disable runs as one).
 * resource_associated_entity_id of an OBJECT resource is its object id (sys.dm_tran_locks).
 */
export const QUEUE_OBJECT_LOCKS = `SELECT l.[request_session_id] AS [Session], l.[request_mode] AS [Mode], l.[request_status] AS [Status],
  CAST(s.[is_user_process] AS int) AS [UserProcess], r.[command] AS [Command]
FROM sys.dm_tran_locks AS l
LEFT JOIN sys.dm_exec_sessions AS s ON s.[session_id] = l.[request_session_id]
LEFT JOIN sys.dm_exec_requests AS r ON r.[session_id] = l.[request_session_id]
WHERE l.[resource_type] = N'OBJECT' AND l.[resource_database_id] = DB_ID()
  AND l.[resource_associated_entity_id] = OBJECT_ID(@queue)
ORDER BY l.[request_status], l.[request_session_id], l.[request_mode];`;

/**
 * GET CONVERSATION GROUP waiting up to @timeoutMs, then what the session looks like right after:
 * the group it got (NULL after the timeout: "If the timeout expires, GET CONVERSATION GROUP sets
 * the @conversation_group_id variable to NULL",
 * https://learn.microsoft.com/sql/t-sql/statements/get-conversation-group-transact-sql), its open
 * transactions and its session id.
 */
export function waitForGroup(queue: BrokerObjectName): string {
  return `DECLARE @group uniqueidentifier;
WAITFOR (GET CONVERSATION GROUP @group FROM ${quoteBrokerObject(queue)}), TIMEOUT @timeoutMs;
SELECT CAST(@group AS nvarchar(36)) AS [GroupId], @@TRANCOUNT AS [TranCount], @@SPID AS [Spid];`;
}

/** GET CONVERSATION GROUP without WAITFOR: the group a reader would get now (NULL: none). */
export function conversationGroupNow(queue: BrokerObjectName): string {
  return `DECLARE @group uniqueidentifier;
GET CONVERSATION GROUP @group FROM ${quoteBrokerObject(queue)};
SELECT CAST(@group AS nvarchar(36)) AS [GroupId];`;
}

/**
 * Ends session @spid (int) and rolls its transaction back. KILL takes no variable, hence the
 * dynamic statement, built from an int only. Needs ALTER ANY CONNECTION
 * (https://learn.microsoft.com/sql/t-sql/language-elements/kill-transact-sql).
 */
export const KILL_SESSION = `DECLARE @statement nvarchar(64) = N'KILL ' + CAST(@spid AS nvarchar(11)) + N';';
EXEC (@statement);`;

/**
 * A savepoint set and rolled back to inside the caller's transaction, with a result in between:
 * "ROLLBACK TRANSACTION savepoint_name … doesn't decrement @@TRANCOUNT"
 * (https://learn.microsoft.com/sql/t-sql/language-elements/rollback-transaction-transact-sql). Whether
 * the server sends ENVCHANGE type 10 (rollback transaction) for it is the question of fact 3
 * (https://learn.microsoft.com/openspecs/windows_protocols/ms-tds/2b3eb7e5-d43d-4d1b-bf4d-76b9e3afc791).
 */
export const SAVEPOINT_ROUND_TRIP = `SAVE TRANSACTION sq_fact3;
SELECT 1 AS [One];
ROLLBACK TRANSACTION sq_fact3;`;

/**
 * A DMV read on the session itself (review 2, R2-2): under IMPLICIT_TRANSACTIONS ON, SELECT opens
 * a transaction except "SELECT statements that do not select from a table"
 * (https://learn.microsoft.com/sql/t-sql/statements/set-implicit-transactions-transact-sql); whether
 * a DMV counts as a table is what fact 4 observes.
 */
export const DMV_READ = `SELECT @@TRANCOUNT AS [Before],
  (SELECT [deadlock_priority] FROM sys.dm_exec_sessions WHERE [session_id] = @@SPID) AS [DeadlockPriority];`;

/** A dialog row the sender's tables would hold for @dialogKey (fact 5 puts keys around the one it locks). */
export function insertDialogRow(schema: string): string {
  return `INSERT INTO ${quoteMssqlIdentifier(schema)}.[BrokerDialogs] ([Queue], [DialogKey], [ConversationHandle], [State], [Sent])
VALUES (@queue, @dialogKey, NEWID(), 'A', 0);`;
}

/** The sender's dialog rows (a table read inside a broker transaction, fact i). */
export function countDialogs(schema: string): string {
  return `SELECT COUNT_BIG(*) AS [Dialogs] FROM ${quoteMssqlIdentifier(schema)}.[BrokerDialogs];`;
}

/**
 * The store's idempotency-key check as it reads in a caller's SNAPSHOT transaction: READCOMMITTEDLOCK
 * "reads … by using locking … regardless of the setting of the READ_COMMITTED_SNAPSHOT database
 * option" (https://learn.microsoft.com/sql/t-sql/queries/hints-transact-sql-table).
 */
export function keyedJobLocking(schema: string): string {
  return `SELECT CAST([Id] AS varchar(20)) AS [Id] FROM ${quoteMssqlIdentifier(schema)}.[Jobs] WITH (READCOMMITTEDLOCK, FORCESEEK)
WHERE [Queue] = @queue AND [IdempotencyKey] = @key AND [IdempotencyKey] IS NOT NULL;`;
}

/** The same key read without the hint: in a SNAPSHOT transaction it reads the snapshot. */
export function keyedJobPlain(schema: string): string {
  return `SELECT CAST([Id] AS varchar(20)) AS [Id] FROM ${quoteMssqlIdentifier(schema)}.[Jobs]
WHERE [Queue] = @queue AND [IdempotencyKey] = @key AND [IdempotencyKey] IS NOT NULL;`;
}

/**
 * A write of group row (@queue, @groupKey) with READCOMMITTEDLOCK, which in a SNAPSHOT transaction
 * may raise 3960 when the row changed after the snapshot began ("Snapshot isolation transaction
 * aborted due to update conflict", Transaction Locking and Row Versioning Guide,
 * https://learn.microsoft.com/sql/relational-databases/sql-server-transaction-locking-and-row-versioning-guide).
 */
export function touchGroupRow(schema: string): string {
  return `UPDATE ${quoteMssqlIdentifier(schema)}.[Groups] WITH (READCOMMITTEDLOCK) SET [UpdatedAt] = SYSUTCDATETIME()
WHERE [Queue] = @queue AND [GroupKey] = @groupKey;
SELECT @@ROWCOUNT AS [Updated];`;
}

/** Group row (@queue, @groupKey): its head and holder (no row: none). */
export function groupRow(schema: string): string {
  return `SELECT CAST([HeadId] AS varchar(20)) AS [HeadId], CAST([HeldToken] AS nvarchar(36)) AS [HeldToken]
FROM ${quoteMssqlIdentifier(schema)}.[Groups] WHERE [Queue] = @queue AND [GroupKey] = @groupKey;`;
}

/** What sys.transmission_queue holds for conversation @handle (messages not delivered yet). */
export const TRANSMISSION_QUEUE_OF_CONVERSATION = `SELECT COUNT(*) AS [Messages], MAX([transmission_status]) AS [Status]
FROM sys.transmission_queue WHERE [conversation_handle] = @handle;`;

/**
 * Receives the next message and gives it back (the old reader's backoff): "The partial rollback
 * returns the message to the queue while continuing to hold a lock on the conversation group"
 * (https://learn.microsoft.com/sql/database-engine/service-broker/handling-poison-messages).
 */
export function receiveAndGiveBack(queue: BrokerObjectName): string {
  return `SAVE TRANSACTION sq_fact9;
RECEIVE TOP (1) CAST([conversation_group_id] AS nvarchar(36)) AS [GroupId] FROM ${quoteBrokerObject(queue)};
ROLLBACK TRANSACTION sq_fact9;`;
}

/**
 * The old reader's RECEIVE of group @group after it ended the group's only conversation in the
 * same transaction (fact 13): the error, if any, is caught and answered, so the transaction's
 * state can be read. "If the conversation handle or conversation group identifier specified in
 * the WHERE clause does not exist … the RECEIVE statement returns an error" (RECEIVE).
 */
export function receiveGroupAfterEnd(queue: BrokerObjectName): string {
  return `SET XACT_ABORT OFF;
DECLARE @t TABLE ([conversation_handle] uniqueidentifier NOT NULL);
DECLARE @error int = 0, @message nvarchar(2048) = NULL;
BEGIN TRY
  RECEIVE TOP (10) conversation_handle FROM ${quoteBrokerObject(queue)} INTO @t WHERE conversation_group_id = @group;
END TRY
BEGIN CATCH
  SET @error = ERROR_NUMBER();
  SET @message = ERROR_MESSAGE();
END CATCH;
SELECT @error AS [ErrorNumber], @message AS [ErrorMessage], (SELECT COUNT(*) FROM @t) AS [Received], XACT_STATE() AS [XactState];`;
}

/**
 * The rounding of fact 12: "2026-01-01T00:00:00.1236" stored as datetime2(3), as text (style 121)
 * so no client rounding hides it (CAST and CONVERT,
 * https://learn.microsoft.com/sql/t-sql/functions/cast-and-convert-transact-sql).
 */
export const DATETIME2_ROUNDING = `SELECT CONVERT(varchar(23), CAST('2026-01-01T00:00:00.1236' AS datetime2(3)), 121) AS [Stored];`;

/**
 * The enqueue's own "now" statements (`enqueueNow`, taken from the library's text), run on a
 * fixed clock @clock (nvarchar) instead of SYSUTCDATETIME(): what @now becomes and what a
 * datetime2(3) column then stores.
 */
export function enqueueNowOnClock(enqueueNow: string): string {
  if (!enqueueNow.includes('SYSUTCDATETIME()')) throw new Error('the enqueue no longer reads SYSUTCDATETIME()');
  return `${enqueueNow.replace('SYSUTCDATETIME()', 'CAST(@clock AS datetime2(7))').trimEnd()}
SELECT CONVERT(varchar(27), @now, 121) AS [Now], CONVERT(varchar(23), CAST(@now AS datetime2(3)), 121) AS [Stored];`;
}

/**
 * Two RECEIVE TOP (n) … INTO the same table variable, without WAITFOR, in one transaction, with
 * what each left behind: @@ROWCOUNT and the table variable's count after each, how many
 * conversation groups the first took, and the batch's duration. @received is declared as
 * moveMessages declares it (RECEIVED_TABLE). SET XACT_ABORT ON: any error rolls the transaction back.
 */
export function receiveTwiceInto(queue: BrokerObjectName, top: number): string {
  const n = assertInteger('RECEIVE TOP', top, 1, 1_000);
  const columns =
    'conversation_group_id, conversation_handle, message_sequence_number, message_type_name, message_body';
  const q = quoteBrokerObject(queue);
  return `SET XACT_ABORT ON;
${RECEIVED_TABLE}DECLARE @start datetime2(7) = SYSUTCDATETIME(), @firstRowCount int, @afterFirst int, @firstGroups int,
  @secondRowCount int, @afterSecond int;
BEGIN TRANSACTION;
RECEIVE TOP (${n}) ${columns} FROM ${q} INTO @received;
SET @firstRowCount = @@ROWCOUNT;
SET @afterFirst = (SELECT COUNT(*) FROM @received);
SET @firstGroups = (SELECT COUNT(DISTINCT conversation_group_id) FROM @received);
RECEIVE TOP (${n}) ${columns} FROM ${q} INTO @received;
SET @secondRowCount = @@ROWCOUNT;
SET @afterSecond = (SELECT COUNT(*) FROM @received);
COMMIT TRANSACTION;
SELECT @firstRowCount AS [FirstRowCount], @afterFirst AS [AfterFirst], @firstGroups AS [FirstGroups],
  @secondRowCount AS [SecondRowCount], @afterSecond AS [AfterSecond],
  (SELECT COUNT(DISTINCT conversation_group_id) FROM @received) AS [Groups],
  DATEDIFF(millisecond, @start, SYSUTCDATETIME()) AS [ElapsedMs], @@TRANCOUNT AS [TranCount];`;
}

/**
 * RECEIVE of five columns INTO a table variable of four: "The table variable must have the same
 * number of columns as are in the messages" (RECEIVE), so this must fail: the proof that fact c's
 * check of moveMessages' @received is not vacuous.
 */
export function receiveIntoTooFewColumns(queue: BrokerObjectName): string {
  return `DECLARE @t TABLE (
  conversation_group_id uniqueidentifier NOT NULL,
  conversation_handle uniqueidentifier NOT NULL,
  message_sequence_number bigint NOT NULL,
  message_type_name nvarchar(256) NOT NULL
);
RECEIVE TOP (1) conversation_group_id, conversation_handle, message_sequence_number, message_type_name, message_body
FROM ${quoteBrokerObject(queue)} INTO @t;`;
}

/**
 * The move's encodings on values of our own (@bytes, @utf16 varbinary; @guid uniqueidentifier),
 * in the move's shape (a correlated scalar FOR JSON PATH, WITHOUT_ARRAY_WRAPPER subquery):
 * varbinary becomes a "BASE64-encoded string"
 * (https://learn.microsoft.com/sql/relational-databases/json/how-for-json-converts-sql-server-data-types-to-json-data-types-sql-server),
 * and "If you don't specify the INCLUDE_NULL_VALUES option, the JSON output doesn't include
 * properties for values that are null"
 * (https://learn.microsoft.com/sql/relational-databases/json/include-null-values-in-json-include-null-values-option).
 */
export const FOR_JSON_PROBE = `SELECT (SELECT v.[Bytes] AS [body], v.[Missing] AS [missing], CONVERT(nvarchar(36), v.[Guid]) AS [guid]
        FOR JSON PATH, WITHOUT_ARRAY_WRAPPER) AS [Json],
  CONVERT(nvarchar(36), v.[Guid]) AS [GuidText],
  CAST(v.[Utf16] AS nvarchar(max)) AS [Text]
FROM (SELECT CAST(@bytes AS varbinary(max)) AS [Bytes], CAST(NULL AS int) AS [Missing], @guid AS [Guid],
             CAST(@utf16 AS varbinary(max)) AS [Utf16]) AS v;`;

/** The jobs of table queue @queue in id order, with their payload text. */
export function jobsOfQueue(schema: string): string {
  return `SELECT CAST([Id] AS varchar(20)) AS [Id], [State], [GroupKey], [Payload]
FROM ${quoteMssqlIdentifier(schema)}.[Jobs] WHERE [Queue] = @queue ORDER BY [Id];`;
}

/**
 * Inside the caller's transaction: an exclusive table lock on Jobs, held to its end (TABLOCKX,
 * HOLDLOCK; table hints), so an INSERT into Jobs waits for it. Fact e makes a move's enqueue fail
 * that way, through the move's own LOCK_TIMEOUT.
 */
export function holdJobsTable(schema: string): string {
  return `SELECT COUNT_BIG(*) AS [Jobs] FROM ${quoteMssqlIdentifier(schema)}.[Jobs] WITH (TABLOCKX, HOLDLOCK);`;
}

/**
 * Up to 50 messages of the notification queue (waiting up to @timeoutMs), each EventNotification's
 * EVENT_INSTANCE read by SQL Server's XML parser as the listener reads it (receiveNotifications),
 * with the time it was put in the queue (message_enqueue_time, datetimeoffset) in ms since 1970,
 * UTC. Params: @timeoutMs int, @eventNotificationType nvarchar.
 */
export function receiveNotificationTimes(notificationQueue: BrokerObjectName): string {
  return `DECLARE @received TABLE (
  message_type_name nvarchar(256) NOT NULL,
  message_body varbinary(max) NULL,
  message_enqueue_time datetimeoffset NULL
);
WAITFOR (
  RECEIVE TOP (50) message_type_name, message_body, message_enqueue_time
  FROM ${quoteBrokerObject(notificationQueue)} INTO @received
), TIMEOUT @timeoutMs;
SELECT r.message_type_name AS [Type],
  x.body.value('(/EVENT_INSTANCE/EventType)[1]', 'nvarchar(128)') AS [EventType],
  x.body.value('(/EVENT_INSTANCE/SchemaName)[1]', 'nvarchar(128)') AS [SchemaName],
  x.body.value('(/EVENT_INSTANCE/ObjectName)[1]', 'nvarchar(128)') AS [ObjectName],
  CAST(DATEDIFF_BIG(millisecond, CAST('1970-01-01' AS datetime2(3)),
    CAST(SWITCHOFFSET(r.message_enqueue_time, '+00:00') AS datetime2(3))) AS varchar(20)) AS [EnqueuedMs]
FROM @received AS r
CROSS APPLY (
  SELECT CASE WHEN r.message_type_name = @eventNotificationType THEN CAST(r.message_body AS xml) END AS body
) AS x;`;
}

/**
 * The first message of conversation @handle (RECEIVE TOP (1) … WHERE conversation_handle: "For a
 * given conversation, a RECEIVE statement returns messages in ascending message_sequence_number
 * order", RECEIVE), in the caller's transaction.
 */
export function receiveFirstOfConversation(queue: BrokerObjectName): string {
  return `RECEIVE TOP (1) CAST([conversation_handle] AS nvarchar(36)) AS [Handle], [message_type_name] AS [Type],
  CAST([message_sequence_number] AS varchar(20)) AS [Sequence]
FROM ${quoteBrokerObject(queue)}
WHERE conversation_handle = @handle;`;
}

/**
 * The messages of conversation @handle in the queue, read without receiving them (WITH (NOLOCK),
 * as readyMessages), in the queue's order (queuing_order, "Message order number in the queue",
 * RECEIVE, Queue Columns), with the sequence number the server gave each.
 */
export function queuedMessagesOfConversation(queue: BrokerObjectName): string {
  return `SELECT [message_type_name] AS [Type], CAST([message_sequence_number] AS varchar(20)) AS [Sequence],
  CAST([queuing_order] AS varchar(20)) AS [QueuingOrder], CAST([status] AS int) AS [Status]
FROM ${quoteBrokerObject(queue)} WITH (NOLOCK)
WHERE [conversation_handle] = @handle
ORDER BY [queuing_order];`;
}

/**
 * In the caller's transaction, as a move ends a conversation (moveMessages: XACT_ABORT off, END
 * CONVERSATION in TRY/CATCH): ends conversation @handle, then ends it again, then ends a handle
 * that never existed (NEWID()), each of the last two in TRY/CATCH, recording ERROR_NUMBER() and
 * XACT_STATE() in the CATCH (0 and NULL: no error). XACT_STATE() 1: the session "can perform any
 * actions, including writing data and committing the transaction"; -1: the transaction is
 * uncommittable, only a full rollback is left
 * (https://learn.microsoft.com/sql/t-sql/functions/xact-state-transact-sql). Then the state the
 * transaction is in, for the caller's COMMIT.
 */
export const END_AGAIN_AND_UNKNOWN_IN_TRANSACTION = `SET XACT_ABORT OFF;
DECLARE @againError int = 0, @againState int = NULL, @unknownError int = 0, @unknownState int = NULL;
DECLARE @unknown uniqueidentifier = NEWID();
END CONVERSATION @handle;
BEGIN TRY
  END CONVERSATION @handle;
END TRY
BEGIN CATCH
  SET @againError = ERROR_NUMBER();
  SET @againState = XACT_STATE();
END CATCH;
BEGIN TRY
  END CONVERSATION @unknown;
END TRY
BEGIN CATCH
  SET @unknownError = ERROR_NUMBER();
  SET @unknownState = XACT_STATE();
END CATCH;
SELECT @againError AS [AgainError], @againState AS [AgainXactState], @unknownError AS [UnknownError],
  @unknownState AS [UnknownXactState], XACT_STATE() AS [XactState], @@TRANCOUNT AS [TranCount];`;

/** Every statement above, named, for the grammar gate (test/unit/tsql-grammar.spec.ts). */
export function everyServerFactStatement(schema: string): [string, string][] {
  const queue = { schema, name: 'facts_TargetQueue' };
  const resolved = { messageType: `nestjs-sql-queue/${schema}/facts/message` } as ResolvedBrokerQueue;
  return [
    ['server permissions', SERVER_PERMISSIONS],
    ['enable poison handling', enablePoisonHandling(queue)],
    ['queue flags', QUEUE_FLAGS],
    ['send on conversation', sendOnConversation(resolved)],
    ['send with a lock timeout', withLockTimeout(1000, sendOnConversation(resolved))],
    ['receive next', receiveNext(queue)],
    ['receive next with a lock timeout', withLockTimeout(1000, receiveNext(queue))],
    ['receive of group', receiveOfGroup(queue)],
    ['ready messages', readyMessages(queue)],
    ['ready messages with a lock timeout', withLockTimeout(1000, readyMessages(queue))],
    ['messages of conversation', messagesOfConversation(queue)],
    ['queue object locks', QUEUE_OBJECT_LOCKS],
    ['wait for group', waitForGroup(queue)],
    ['conversation group now', conversationGroupNow(queue)],
    ['kill session', KILL_SESSION],
    ['savepoint round trip', SAVEPOINT_ROUND_TRIP],
    ['dmv read', DMV_READ],
    ['insert dialog row', insertDialogRow(schema)],
    ['count dialogs', countDialogs(schema)],
    ['keyed job locking', keyedJobLocking(schema)],
    ['keyed job plain', keyedJobPlain(schema)],
    ['touch group row', touchGroupRow(schema)],
    ['group row', groupRow(schema)],
    ['transmission queue of conversation', TRANSMISSION_QUEUE_OF_CONVERSATION],
    ['receive and give back', receiveAndGiveBack(queue)],
    ['receive group after end', receiveGroupAfterEnd(queue)],
    ['datetime2 rounding', DATETIME2_ROUNDING],
    [
      'enqueue now on a clock',
      enqueueNowOnClock(`DECLARE @now datetime2(7) = SYSUTCDATETIME();
SET @now = DATEADD(nanosecond, -(DATEPART(nanosecond, @now) % 1000000), @now);
`),
    ],
    ['receive twice into', receiveTwiceInto(queue, 10)],
    ['receive into too few columns', receiveIntoTooFewColumns(queue)],
    ['for json probe', FOR_JSON_PROBE],
    ['jobs of queue', jobsOfQueue(schema)],
    ['hold jobs table', holdJobsTable(schema)],
    ['receive notification times', receiveNotificationTimes({ schema, name: 'BrokerActivationQueue' })],
    ['receive first of conversation', receiveFirstOfConversation(queue)],
    ['queued messages of conversation', queuedMessagesOfConversation(queue)],
    ['end again and unknown in transaction', END_AGAIN_AND_UNKNOWN_IN_TRANSACTION],
  ];
}
