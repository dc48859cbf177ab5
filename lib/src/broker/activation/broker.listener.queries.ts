import { quoteBrokerObject } from '../broker.names.js';
import type { BrokerObjectName } from '../broker.types.js';

// The activation listener's statements and the broker health reading: one statement, one
// function; every value is a bound parameter, every name a validated, bracketed identifier.

/** Most notification messages taken per transaction (one RECEIVE returns one conversation group's). */
export const NOTIFICATIONS_PER_RECEIVE = 50;

/**
 * One wait on the notification queue, inside the listener's transaction: up to 50 messages,
 * or none after @timeoutMs. Params: @timeoutMs int, @eventNotificationType nvarchar (the
 * EventNotification message type).
 *
 * The EVENT_INSTANCE body is read by SQL Server's own XML parser (`CAST … AS xml` and
 * `.value()`), not in Node: the engine knows the body's encoding (it stores xml as UTF-16, and
 * no server runs here to show us the bytes), entities and whitespace, and only four short
 * strings cross the wire. RECEIVE's column list takes no xml methods, so the messages land in a
 * table variable first. The CASE keeps the cast to EventNotification messages (XML by
 * contract): EndDialog has no body, and nothing else reaches this service. A failing cast would
 * leave the batch's messages received but unread, so it must not happen for any message type.
 *
 * `this_database` is 1 when the event came from the database we are connected to: only
 * those events route to our queues (the notification service could be shared).
 */
export function receiveNotifications(notificationQueue: BrokerObjectName): string {
  return `DECLARE @received TABLE (
  conversation_handle uniqueidentifier NOT NULL,
  message_type_name nvarchar(256) NOT NULL,
  message_body varbinary(max) NULL
);
WAITFOR (
  RECEIVE TOP (${NOTIFICATIONS_PER_RECEIVE}) conversation_handle, message_type_name, message_body
  FROM ${quoteBrokerObject(notificationQueue)} INTO @received
), TIMEOUT @timeoutMs;
SELECT r.conversation_handle, r.message_type_name,
  x.body.value('(/EVENT_INSTANCE/EventType)[1]', 'nvarchar(128)') AS event_type,
  x.body.value('(/EVENT_INSTANCE/SchemaName)[1]', 'nvarchar(128)') AS schema_name,
  x.body.value('(/EVENT_INSTANCE/ObjectName)[1]', 'nvarchar(128)') AS object_name,
  CASE WHEN x.body.value('(/EVENT_INSTANCE/DatabaseName)[1]', 'nvarchar(128)') = DB_NAME() THEN 1 ELSE 0 END AS this_database
FROM @received AS r
CROSS APPLY (
  SELECT CASE WHEN r.message_type_name = @eventNotificationType THEN CAST(r.message_body AS xml) END AS body
) AS x;`;
}

/**
 * Ends a notification dialog that the server already broke (an Error or EndDialog arrived on
 * it). Live notification dialogs are never ended: see BrokerActivationListener. Param:
 * @handle uniqueidentifier.
 */
export function endBrokenNotificationDialog(): string {
  return 'END CONVERSATION @handle;';
}

/**
 * The slow poll's look at one consumed queue, in one autocommit statement: does it hold a
 * message ready to receive (status 1: the queue's columns are 0 retained received, 1 ready to
 * receive, 2 not yet complete, 3 retained sent — CREATE QUEUE, "columns in a queue"); do its two event notifications exist; is it
 * receive-enabled. The queue is read as Microsoft's "Querying Queues" page advises, WITH
 * (NOLOCK), so the poll never blocks or waits on readers (it takes no row locks; a dirty
 * answer only makes the poll start a reader that finds nothing and retires). EXISTS stops
 * at the first row. Params: @queue nvarchar ('[schema].[name]'), @activationName,
 * @disabledName nvarchar.
 */
export function pollBrokerQueue(queue: BrokerObjectName): string {
  return `SELECT
  CASE WHEN EXISTS (SELECT 1 FROM ${quoteBrokerObject(queue)} WITH (NOLOCK) WHERE status = 1) THEN 1 ELSE 0 END AS has_messages,
  CASE WHEN EXISTS (
    SELECT 1 FROM sys.event_notifications WHERE parent_id = OBJECT_ID(@queue) AND name = @activationName
  ) THEN 1 ELSE 0 END AS activation_exists,
  CASE WHEN EXISTS (
    SELECT 1 FROM sys.event_notifications WHERE parent_id = OBJECT_ID(@queue) AND name = @disabledName
  ) THEN 1 ELSE 0 END AS disabled_exists,
  (SELECT q.is_receive_enabled FROM sys.service_queues AS q WHERE q.object_id = OBJECT_ID(@queue)) AS is_receive_enabled;`;
}

/**
 * The health reading of one broker queue, in one autocommit statement: the broker is on in
 * this database, the queue exists and is receive- and enqueue-enabled, and its activation
 * event notification exists. Catalog views only (no queue rows), so it never waits on readers.
 * A missing queue reads as NULL flags. Params: @queue nvarchar ('[schema].[name]'),
 * @activationName nvarchar.
 */
export function readBrokerQueueHealth(): string {
  return `SELECT
  (SELECT d.is_broker_enabled FROM sys.databases AS d WHERE d.database_id = DB_ID()) AS is_broker_enabled,
  (SELECT q.is_receive_enabled FROM sys.service_queues AS q WHERE q.object_id = OBJECT_ID(@queue)) AS is_receive_enabled,
  (SELECT q.is_enqueue_enabled FROM sys.service_queues AS q WHERE q.object_id = OBJECT_ID(@queue)) AS is_enqueue_enabled,
  CASE WHEN EXISTS (
    SELECT 1 FROM sys.event_notifications WHERE parent_id = OBJECT_ID(@queue) AND name = @activationName
  ) THEN 1 ELSE 0 END AS activation_exists;`;
}

/**
 * Who holds broker queue @queue ('[schema].[name]') and who waits for it, from the lock
 * manager (review 2, R2-4): [SchemaLockWaiters], requests for a schema-modification lock on
 * the queue that wait (Service Broker's poison-message disable after five rolled-back
 * receives, ALTER QUEUE, an event notification being dropped or created: while one waits,
 * every later RECEIVE, SEND and even NOLOCK read of the queue waits behind it), and the
 * session whose transaction has held a lock on the queue longest, with the transaction's age
 * ([HolderSession], [HolderAgeMs]; another session, NULL when none). Needs VIEW SERVER STATE
 * (VIEW SERVER PERFORMANCE STATE from SQL Server 2022, VIEW DATABASE STATE on Azure SQL);
 * without it the statement fails and the health reading says so.
 * transaction_begin_time is the server's local time, hence GETDATE().
 */
export function readBrokerQueueLocks(): string {
  return `SELECT
  (SELECT COUNT(*) FROM sys.dm_tran_locks AS w
   WHERE w.resource_type = N'OBJECT' AND w.resource_database_id = DB_ID()
     AND w.resource_associated_entity_id = OBJECT_ID(@queue)
     AND w.request_mode = N'Sch-M' AND w.request_status = N'WAIT') AS [SchemaLockWaiters],
  h.[Session] AS [HolderSession], h.[AgeMs] AS [HolderAgeMs]
FROM (SELECT 1 AS [One]) AS one
OUTER APPLY (
  SELECT TOP (1) l.request_session_id AS [Session], DATEDIFF_BIG(millisecond, t.transaction_begin_time, GETDATE()) AS [AgeMs]
  FROM sys.dm_tran_locks AS l
  JOIN sys.dm_tran_session_transactions AS st ON st.session_id = l.request_session_id
  JOIN sys.dm_tran_active_transactions AS t ON t.transaction_id = st.transaction_id
  WHERE l.resource_type = N'OBJECT' AND l.resource_database_id = DB_ID()
    AND l.resource_associated_entity_id = OBJECT_ID(@queue) AND l.request_status = N'GRANT'
    AND l.request_session_id <> @@SPID
  ORDER BY t.transaction_begin_time
) AS h;`;
}
