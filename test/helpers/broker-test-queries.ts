import {
  BROKER_ACTIVATION_NOTIFICATION,
  BROKER_NAME_PREFIX,
  brokerStringLiteral,
  quoteBrokerObject,
} from '../../lib/src/broker/broker.names.js';
import type { BrokerObjectName, ResolvedBrokerQueue } from '../../lib/src/broker/broker.types.js';
import { quoteMssqlIdentifier } from '../../lib/src/store/mssql/mssql.identifiers.js';

/**
 * Every T-SQL statement the Service Broker live tests (test/integration/mssql/broker-*) send
 * themselves, one function each, so that test/unit/tsql-grammar.spec.ts parses all of them: none
 * runs where SQL Server is absent. Values are parameters; only names the library validated
 * (schema, queue, service, contract, message type) are spliced in, bracket-quoted, or as N'…'
 * where T-SQL wants a string (TO SERVICE). Test logins are [A-Za-z0-9_] names made by the test.
 *
 * Loaded by the worker processes too (test/workers), so it imports nothing from vitest.
 */

/** Whether Service Broker delivers messages in the connection's database (sys.databases). */
export const BROKER_ENABLED = `SELECT DB_NAME() AS [Database], CAST(d.[is_broker_enabled] AS int) AS [BrokerEnabled]
FROM sys.databases AS d
WHERE d.[database_id] = DB_ID();`;

/**
 * A Service Broker queue's status; @queue is its quoted two-part name. No row: no such queue.
 * [PoisonHandling] is sys.service_queues.is_poison_message_handling_enabled (SQL Server 2012 and
 * later): 1 while five rolled-back receives would disable the queue.
 */
export const QUEUE_STATUS = `SELECT CAST(q.[is_receive_enabled] AS int) AS [ReceiveEnabled], CAST(q.[is_enqueue_enabled] AS int) AS [EnqueueEnabled],
  CAST(q.[is_poison_message_handling_enabled] AS int) AS [PoisonHandling]
FROM sys.service_queues AS q
WHERE q.[object_id] = OBJECT_ID(@queue);`;

/**
 * Creates schema @schema unless it exists (CREATE SCHEMA must be alone in its batch, hence
 * sp_executesql; the name goes through QUOTENAME, never spliced).
 */
export const ENSURE_SCHEMA = `IF SCHEMA_ID(@schema) IS NULL
BEGIN
  DECLARE @create nvarchar(300) = N'CREATE SCHEMA ' + QUOTENAME(@schema) + N';';
  EXEC sys.sp_executesql @create;
END;`;

/** The event notifications on a queue (@queue: its quoted two-part name). */
export const EVENT_NOTIFICATIONS_OF_QUEUE = `SELECT en.[name] AS [Name]
FROM sys.event_notifications AS en
WHERE en.[parent_id] = OBJECT_ID(@queue)
ORDER BY en.[name];`;

/**
 * Conversation endpoints of the services whose names start with @prefix (ours are
 * 'nestjs-sql-queue/<schema>/…'), by state and side. A prefix compare, not LIKE: '_' in a
 * schema name is not a wildcard here.
 */
export const ENDPOINTS_BY_STATE = `SELECT ce.[state_desc] AS [State], CAST(ce.[is_initiator] AS int) AS [Initiator], COUNT(*) AS [Endpoints]
FROM sys.conversation_endpoints AS ce
JOIN sys.services AS s ON s.[service_id] = ce.[service_id]
WHERE LEFT(s.[name], LEN(@prefix)) = @prefix
GROUP BY ce.[state_desc], ce.[is_initiator]
ORDER BY ce.[state_desc], ce.[is_initiator];`;

/** Both endpoints of the conversation that endpoint @handle (either side) belongs to. */
export const ENDPOINTS_OF_CONVERSATION = `SELECT CAST(e.[is_initiator] AS int) AS [Initiator], e.[state_desc] AS [State],
  CAST(e.[conversation_handle] AS nvarchar(36)) AS [Handle], CAST(e.[conversation_group_id] AS nvarchar(36)) AS [GroupId]
FROM sys.conversation_endpoints AS mine
JOIN sys.conversation_endpoints AS e ON e.[conversation_id] = mine.[conversation_id]
WHERE mine.[conversation_handle] = @handle
ORDER BY e.[is_initiator];`;

/** Messages in a Service Broker queue (a SELECT on a queue reads without receiving). */
export function messagesInQueue(queue: BrokerObjectName): string {
  return `SELECT COUNT(*) AS [Messages] FROM ${quoteBrokerObject(queue)};`;
}

/**
 * Inside the caller's open transaction: locks conversation group @group without taking its
 * message. The RECEIVE locks the group "until the transaction that contains the statement
 * finishes"; rolling back to the savepoint returns the message "while continuing to hold a lock
 * on the conversation group" (Handling Poison Messages), and is not a rollback that counts
 * toward the queue's poison-message disable. Returns the message it saw.
 */
export function holdConversationGroup(queue: BrokerObjectName): string {
  return `SAVE TRANSACTION h5_hold;
RECEIVE TOP (1) CAST([conversation_handle] AS nvarchar(36)) AS [Handle], [message_sequence_number] AS [Sequence]
FROM ${quoteBrokerObject(queue)} WHERE conversation_group_id = @group;
ROLLBACK TRANSACTION h5_hold;`;
}

/**
 * One message of any unlocked group, in the caller's transaction: rolled back, it returns to the
 * queue (the poison tests); kept open, the transaction holds the queue (the health tests).
 */
export function receiveAny(queue: BrokerObjectName): string {
  return `RECEIVE TOP (1) CAST([conversation_handle] AS nvarchar(36)) AS [Handle] FROM ${quoteBrokerObject(queue)};`;
}

/** Drops schema @schema if it exists (it must be empty by then), the name through QUOTENAME. */
export const DROP_SCHEMA_IF_EXISTS = `IF SCHEMA_ID(@schema) IS NOT NULL
BEGIN
  DECLARE @drop nvarchar(300) = N'DROP SCHEMA ' + QUOTENAME(@schema) + N';';
  EXEC sys.sp_executesql @drop;
END;`;

/**
 * A queue as an older setup, or a DBA following Microsoft's defaults, would have made it:
 * POISON_MESSAGE_HANDLING ON (CREATE QUEUE's default), so five rolled-back receives disable it.
 */
export function createQueueWithPoisonHandling(queue: BrokerObjectName): string {
  return `CREATE QUEUE ${quoteBrokerObject(queue)} WITH STATUS = ON, RETENTION = OFF, POISON_MESSAGE_HANDLING (STATUS = ON);`;
}

/** The fix the 'poison-handling-on' warning names. */
export function disablePoisonHandling(queue: BrokerObjectName): string {
  return `ALTER QUEUE ${quoteBrokerObject(queue)} WITH POISON_MESSAGE_HANDLING (STATUS = OFF);`;
}

/**
 * Every lock request on queue @queue (its quoted two-part name) or on its internal message table
 * (sys.internal_tables, QUEUE_MESSAGES, parent_id = the queue's object_id), granted or waiting,
 * by any session but this one: [On] says which of the two objects. The library's health reading
 * (readBrokerQueueLocks) looks at the queue's object only; listing the internal table too lets a
 * failing test tell "no lock" from "a lock on the other object". Needs VIEW SERVER STATE.
 */
export const LOCKS_ON_QUEUE = `SELECT l.[request_session_id] AS [Session], l.[request_mode] AS [Mode], l.[request_status] AS [Status],
  CASE WHEN l.[resource_associated_entity_id] = OBJECT_ID(@queue) THEN N'queue' ELSE N'internal table' END AS [On]
FROM sys.dm_tran_locks AS l
WHERE l.[resource_type] = N'OBJECT' AND l.[resource_database_id] = DB_ID()
  AND (l.[resource_associated_entity_id] = OBJECT_ID(@queue)
    OR l.[resource_associated_entity_id] IN (
      SELECT it.[object_id] FROM sys.internal_tables AS it WHERE it.[parent_id] = OBJECT_ID(@queue)))
  AND l.[request_session_id] <> @@SPID
ORDER BY l.[request_session_id], l.[request_mode];`;

/**
 * Schema-modification lock requests waiting on any Service Broker queue of schema @schema
 * (Service Broker's poison-message task, an ALTER QUEUE, an event notification being changed):
 * while one waits, every RECEIVE, SEND and read of that queue queues behind it. Needs VIEW
 * SERVER STATE.
 */
export const SCHEMA_LOCK_WAITS_IN_SCHEMA = `SELECT l.[request_session_id] AS [Session], OBJECT_NAME(q.[object_id]) AS [Queue]
FROM sys.dm_tran_locks AS l
JOIN sys.service_queues AS q ON q.[object_id] = l.[resource_associated_entity_id]
WHERE l.[resource_type] = N'OBJECT' AND l.[resource_database_id] = DB_ID()
  AND l.[request_mode] = N'Sch-M' AND l.[request_status] = N'WAIT'
  AND q.[schema_id] = SCHEMA_ID(@schema);`;

/** Re-enables a queue Service Broker disabled (five rolled-back receives). */
export function enableQueue(queue: BrokerObjectName): string {
  return `ALTER QUEUE ${quoteBrokerObject(queue)} WITH STATUS = ON;`;
}

/** Removes our activation event notification from a target queue, as an operator's mistake would. */
export function dropActivationNotification(queue: BrokerObjectName): string {
  return `DROP EVENT NOTIFICATION ${quoteMssqlIdentifier(BROKER_ACTIVATION_NOTIFICATION)} ON QUEUE ${quoteBrokerObject(queue)};`;
}

/**
 * A T-SQL producer on our initiator service: a new dialog to the target service with one message
 * of the queue's message type (@body: its bytes). Returns the initiator's handle.
 */
export function sendOnNewDialog(queue: ResolvedBrokerQueue): string {
  return `DECLARE @h uniqueidentifier;
BEGIN DIALOG CONVERSATION @h
  FROM SERVICE ${quoteMssqlIdentifier(queue.initiatorService)}
  TO SERVICE ${brokerStringLiteral(queue.service)}, N'CURRENT DATABASE'
  ON CONTRACT ${quoteMssqlIdentifier(queue.contract)}
  WITH ENCRYPTION = OFF;
SEND ON CONVERSATION @h MESSAGE TYPE ${quoteMssqlIdentifier(queue.messageType)} (@body);
SELECT CAST(@h AS nvarchar(36)) AS [Handle];`;
}

/** The T-SQL producer ends its side normally: the target gets EndDialog. */
export const END_CONVERSATION = 'END CONVERSATION @handle;';

/** The T-SQL producer ends its side with an error: the target gets an Error message. */
export const END_CONVERSATION_WITH_ERROR =
  "END CONVERSATION @handle WITH ERROR = 50001 DESCRIPTION = N'the T-SQL producer gives up';";

/**
 * Sessions of client process @pid (tedious sends process.pid at login) with a request running,
 * other than this one: an idle receiver sits in its WAITFOR (GET CONVERSATION GROUP) like that,
 * in autocommit, as do the activation listener and the initiator reader in theirs. Other
 * sessions' requests are visible with VIEW SERVER STATE only.
 */
export const REQUESTS_OF_PROCESS = `SELECT COUNT(*) AS [Sessions]
FROM sys.dm_exec_requests AS r
JOIN sys.dm_exec_sessions AS s ON s.[session_id] = r.[session_id]
WHERE s.[host_process_id] = @pid AND r.[session_id] <> @@SPID;`;

/** Sessions of client process @pid with a transaction open, running or not. */
export const OPEN_TRANSACTIONS_OF_PROCESS = `SELECT COUNT(*) AS [Sessions]
FROM sys.dm_exec_sessions AS s
WHERE s.[host_process_id] = @pid AND s.[open_transaction_count] > 0 AND s.[session_id] <> @@SPID;`;

/**
 * The jobs of broker queue @queue's table queue by the message each carries (the payload a
 * receiver writes, broker.job.ts: conversationHandle, sequence, type, and the JSON body as
 * `text`): how many jobs carry it, how many of them are done, the most attempts one took. One
 * row per received message that became a job; a message moved twice would show Jobs 2.
 */
export function brokerJobsByMessage(schema: string): string {
  return `SELECT m.[ConversationHandle], m.[Sequence], MIN(m.[Type]) AS [Type], MIN(m.[Text]) AS [Text],
  COUNT_BIG(*) AS [Jobs], SUM(CASE WHEN j.[State] = 'done' THEN 1 ELSE 0 END) AS [Done], MAX(j.[Attempts]) AS [Attempts]
FROM ${quoteMssqlIdentifier(schema)}.[Jobs] AS j
CROSS APPLY (
  SELECT JSON_VALUE(j.[Payload], N'$.conversationHandle') AS [ConversationHandle],
    JSON_VALUE(j.[Payload], N'$.sequence') AS [Sequence],
    JSON_VALUE(j.[Payload], N'$.type') AS [Type],
    JSON_VALUE(j.[Payload], N'$.text') AS [Text]
) AS m
WHERE j.[Queue] = @queue
GROUP BY m.[ConversationHandle], m.[Sequence]
ORDER BY m.[ConversationHandle], CAST(m.[Sequence] AS bigint);`;
}

/**
 * Jobs of table queue @queue by state, read WITH (NOLOCK) so that polling it while workers run
 * never waits on their leases (a dirty count only makes the poll look again).
 */
export function jobStatesOfQueue(schema: string): string {
  return `SELECT [State], COUNT_BIG(*) AS [Jobs]
FROM ${quoteMssqlIdentifier(schema)}.[Jobs] WITH (NOLOCK)
WHERE [Queue] = @queue
GROUP BY [State];`;
}

/** Jobs of broker queue @queue's table queue by the message type they carry (JSON_VALUE of the payload's `type`) and state. */
export function brokerJobsByType(schema: string): string {
  return `SELECT JSON_VALUE(j.[Payload], N'$.type') AS [Type], j.[State], COUNT_BIG(*) AS [Jobs]
FROM ${quoteMssqlIdentifier(schema)}.[Jobs] AS j
WHERE j.[Queue] = @queue
GROUP BY JSON_VALUE(j.[Payload], N'$.type'), j.[State];`;
}

/** Whether this login may create logins (the least-privilege test makes one). */
export const CAN_CREATE_LOGINS = `SELECT HAS_PERMS_BY_NAME(NULL, NULL, N'ALTER ANY LOGIN') AS [Granted];`;

// A login or user name the test made up: letters, digits and '_' only.
const TEST_PRINCIPAL = /^[A-Za-z][A-Za-z0-9_]{0,100}$/;
// A generated password: hex digits and a fixed suffix, so no quote can appear.
const TEST_PASSWORD = /^[0-9a-f]{24}Aa1!$/;

function principal(name: string): string {
  if (!TEST_PRINCIPAL.test(name)) throw new Error(`not a test principal name: ${name}`);
  return quoteMssqlIdentifier(name);
}

/** A SQL login for the least-privilege test (DDL takes no parameters; both values are checked). */
export function createTestLogin(login: string, password: string): string {
  if (!TEST_PASSWORD.test(password)) throw new Error('not a generated test password');
  return `CREATE LOGIN ${principal(login)} WITH PASSWORD = N'${password}', CHECK_POLICY = OFF;`;
}

/** The login's user in the current database, defaulting to the module schema. */
export function createTestUser(user: string, schema: string): string {
  return `CREATE USER ${principal(user)} FOR LOGIN ${principal(user)} WITH DEFAULT_SCHEMA = ${quoteMssqlIdentifier(schema)};`;
}

export function dropTestUser(user: string): string {
  return `DROP USER IF EXISTS ${principal(user)};`;
}

/** Fails with 15434 while a session of the login is open. */
export function dropTestLogin(login: string): string {
  return `IF SUSER_ID(${brokerStringLiteral(login)}) IS NOT NULL DROP LOGIN ${principal(login)};`;
}

/**
 * The prefix of every Service Broker name derived for module schema `schema`, or for its broker
 * queue `name` (ENDPOINTS_BY_STATE).
 */
export function brokerNamePrefix(schema: string, name?: string): string {
  return name === undefined ? `${BROKER_NAME_PREFIX}/${schema}/` : `${BROKER_NAME_PREFIX}/${schema}/${name}/`;
}

/** The prefix of the doorbell's service names in module schema `schema` (its target and initiator services). */
export function doorbellNamePrefix(schema: string): string {
  return `${BROKER_NAME_PREFIX}/${schema}/doorbell`;
}

/**
 * A dead message as the old readers (schema versions 6 to 10) kept it in [BrokerDead], for the
 * upgrade test of migration 11 (broker-migration.mssql.spec.ts). The body is @text (nvarchar)
 * cast to varbinary, i.e. its UTF-16LE bytes, as `CAST(N'…' AS varbinary(max))` makes them and
 * send() writes a JSON body, when @text is not NULL; else @body (varbinary, NULL: no body).
 * Params: @queue, @handle, @group (uniqueidentifier), @sequence bigint, @type, @text, @body,
 * @attempts int, @crashes int, @lastError, @reason ('max-attempts', 'crashes',
 * 'conversation-ended'), @deadAt datetime2. Returns the row's [Id].
 */
export function insertBrokerDeadRow(schema: string): string {
  return `INSERT INTO ${quoteMssqlIdentifier(schema)}.[BrokerDead] ([Queue], [ConversationHandle], [ConversationGroupId],
  [MessageSequenceNumber], [MessageTypeName], [MessageBody], [Attempts], [Crashes], [LastError], [Reason], [DeadAt])
OUTPUT CAST(inserted.[Id] AS varchar(20)) AS [Id]
VALUES (@queue, @handle, @group, @sequence, @type, COALESCE(CAST(@text AS varbinary(max)), @body), @attempts, @crashes,
  @lastError, @reason, @deadAt);`;
}

/** Whether table @table (its quoted two-part name) exists: [Exists] 1 or 0. */
export const TABLE_EXISTS = `SELECT CASE WHEN OBJECT_ID(@table, N'U') IS NULL THEN 0 ELSE 1 END AS [Exists];`;

/** The schema versions recorded in [SchemaVersion], in order. */
export function schemaVersions(schema: string): string {
  return `SELECT [Version] FROM ${quoteMssqlIdentifier(schema)}.[SchemaVersion] ORDER BY [Version];`;
}

/** Every statement above, named, for the grammar gate. */
export function everyBrokerTestStatement(schema: string): [string, string][] {
  const queue = { schema, name: 'orders_TargetQueue' };
  const resolved = {
    initiatorService: `${BROKER_NAME_PREFIX}/${schema}/orders/initiator`,
    service: `${BROKER_NAME_PREFIX}/${schema}/orders/target`,
    contract: `${BROKER_NAME_PREFIX}/${schema}/orders/contract`,
    messageType: `${BROKER_NAME_PREFIX}/${schema}/orders/message`,
  } as ResolvedBrokerQueue;
  return [
    ['broker enabled', BROKER_ENABLED],
    ['queue status', QUEUE_STATUS],
    ['ensure schema', ENSURE_SCHEMA],
    ['drop schema if exists', DROP_SCHEMA_IF_EXISTS],
    ['create queue with poison handling', createQueueWithPoisonHandling(queue)],
    ['disable poison handling', disablePoisonHandling(queue)],
    ['locks on queue', LOCKS_ON_QUEUE],
    ['schema lock waits in schema', SCHEMA_LOCK_WAITS_IN_SCHEMA],
    ['event notifications of queue', EVENT_NOTIFICATIONS_OF_QUEUE],
    ['endpoints by state', ENDPOINTS_BY_STATE],
    ['endpoints of conversation', ENDPOINTS_OF_CONVERSATION],
    ['messages in queue', messagesInQueue(queue)],
    ['hold conversation group', holdConversationGroup(queue)],
    ['receive any', receiveAny(queue)],
    ['enable queue', enableQueue(queue)],
    ['drop activation notification', dropActivationNotification(queue)],
    ['send on new dialog', sendOnNewDialog(resolved)],
    ['end conversation', END_CONVERSATION],
    ['end conversation with error', END_CONVERSATION_WITH_ERROR],
    ['requests of process', REQUESTS_OF_PROCESS],
    ['open transactions of process', OPEN_TRANSACTIONS_OF_PROCESS],
    ['broker jobs by message', brokerJobsByMessage(schema)],
    ['job states of queue', jobStatesOfQueue(schema)],
    ['broker jobs by type', brokerJobsByType(schema)],
    ['can create logins', CAN_CREATE_LOGINS],
    ['create test login', createTestLogin('sqlqueue_lp_0a1b2c3d', '0123456789abcdef01234567Aa1!')],
    ['create test user', createTestUser('sqlqueue_lp_0a1b2c3d', schema)],
    ['drop test user', dropTestUser('sqlqueue_lp_0a1b2c3d')],
    ['drop test login', dropTestLogin('sqlqueue_lp_0a1b2c3d')],
    ['insert broker dead row', insertBrokerDeadRow(schema)],
    ['table exists', TABLE_EXISTS],
    ['schema versions', schemaVersions(schema)],
  ];
}
