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

/** A Service Broker queue's status; @queue is its quoted two-part name. No row: no such queue. */
export const QUEUE_STATUS = `SELECT CAST(q.[is_receive_enabled] AS int) AS [ReceiveEnabled], CAST(q.[is_enqueue_enabled] AS int) AS [EnqueueEnabled]
FROM sys.service_queues AS q
WHERE q.[object_id] = OBJECT_ID(@queue);`;

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

/** One message of any unlocked group, in the caller's transaction (which the test rolls back). */
export function receiveAny(queue: BrokerObjectName): string {
  return `RECEIVE TOP (1) CAST([conversation_handle] AS nvarchar(36)) AS [Handle] FROM ${quoteBrokerObject(queue)};`;
}

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
 * Sessions of client process @pid (tedious sends process.pid at login) running a request inside
 * an open transaction: an idle broker reader sits in its WAITFOR like that.
 */
export const OPEN_TRANSACTION_REQUESTS_OF_PROCESS = `SELECT COUNT(*) AS [Sessions]
FROM sys.dm_exec_requests AS r
JOIN sys.dm_exec_sessions AS s ON s.[session_id] = r.[session_id]
WHERE s.[host_process_id] = @pid AND r.[open_transaction_count] > 0 AND r.[session_id] <> @@SPID;`;

/** Sessions of client process @pid with a transaction open, running or not. */
export const OPEN_TRANSACTIONS_OF_PROCESS = `SELECT COUNT(*) AS [Sessions]
FROM sys.dm_exec_sessions AS s
WHERE s.[host_process_id] = @pid AND s.[open_transaction_count] > 0 AND s.[session_id] <> @@SPID;`;

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
    ['open transaction requests of process', OPEN_TRANSACTION_REQUESTS_OF_PROCESS],
    ['open transactions of process', OPEN_TRANSACTIONS_OF_PROCESS],
    ['can create logins', CAN_CREATE_LOGINS],
    ['create test login', createTestLogin('sqlqueue_lp_0a1b2c3d', '0123456789abcdef01234567Aa1!')],
    ['create test user', createTestUser('sqlqueue_lp_0a1b2c3d', schema)],
    ['drop test user', dropTestUser('sqlqueue_lp_0a1b2c3d')],
    ['drop test login', dropTestLogin('sqlqueue_lp_0a1b2c3d')],
  ];
}
