import { assertInteger } from '../core/validation.js';
import { quoteMssqlIdentifier } from '../store/mssql/mssql.identifiers.js';
import { sendEachInIdOrder } from './broker.sender.queries.js';
import type { ResolvedBrokerQueue } from './broker.types.js';

// Dead-message administration and figures of a broker queue: one function per statement, SQL
// text only, every value a parameter.

/** Dead rows re-sent per transaction by retryDeadMessages. */
export const RETRY_BATCH = 1000;
/**
 * Dead rows deleted per statement by purgeDeadMessages: under the 5,000 locks at which SQL Server
 * escalates a statement's row locks to a table lock, so a purge never blocks the readers'
 * dead-letter inserts for its whole run.
 */
export const PURGE_BATCH = 4000;

function dead(schema: string): string {
  return `${quoteMssqlIdentifier(schema)}.[BrokerDead]`;
}

/** A page of a queue's dead messages in Id order. Params: @queue, @afterId bigint, @limit int. */
export function listDeadMessages(schema: string): string {
  return `SELECT TOP (@limit) [Id], [Queue], [ConversationHandle], [ConversationGroupId], [MessageSequenceNumber],
  [MessageTypeName], [MessageBody], [Attempts], [Crashes], [LastError], [Reason], [DeadAt]
FROM ${dead(schema)}
WHERE [Queue] = @queue AND [Id] > @afterId
ORDER BY [Id];`;
}

/** The queue's highest dead Id now: 'retry all' stops there, so messages that die again during it wait. Params: @queue. */
export function lastDeadId(schema: string): string {
  return `SELECT MAX([Id]) AS [LastId] FROM ${dead(schema)} WHERE [Queue] = @queue;`;
}

/**
 * Moves dead rows out of the dead table and SENDs their bodies, in Id order, on the retry's
 * dialog @handle (key @dialogKey), in the caller's transaction: the rows are gone only if the
 * messages were sent. `selection` is either `ids` (@id0 … @id<count-1>) or `range` (the first
 * @batch rows with @afterId < Id <= @lastId). Returns the Ids sent.
 */
export function sendDeadMessages(
  schema: string,
  queue: ResolvedBrokerQueue,
  selection: { ids: number } | 'range',
): string {
  const move =
    selection === 'range'
      ? `WITH batch AS (
  SELECT TOP (@batch) [Id], [MessageBody] FROM ${dead(schema)}
  WHERE [Queue] = @queue AND [Id] > @afterId AND [Id] <= @lastId
  ORDER BY [Id]
)
DELETE FROM batch
OUTPUT deleted.[Id], deleted.[MessageBody] INTO @moved ([Id], [MessageBody]);`
      : `DELETE FROM ${dead(schema)}
OUTPUT deleted.[Id], deleted.[MessageBody] INTO @moved ([Id], [MessageBody])
WHERE [Queue] = @queue AND [Id] IN (${idParams(selection.ids).join(', ')});`;
  return `DECLARE @moved TABLE ([Id] bigint NOT NULL PRIMARY KEY, [MessageBody] varbinary(max) NULL);
DECLARE @rowId bigint = 0, @rowBody varbinary(max), @sent bigint = 0;
${move}
${sendEachInIdOrder('@handle', '@moved', '1 = 1', queue)}
UPDATE ${quoteMssqlIdentifier(schema)}.[BrokerDialogs] SET [Sent] = [Sent] + @sent
WHERE [Queue] = @queue AND [DialogKey] = @dialogKey;
SELECT [Id] FROM @moved ORDER BY [Id];`;
}

/** Parameter names of an id list: @id0, @id1, … */
export function idParams(count: number): string[] {
  assertInteger('dead message id count', count, 1, RETRY_BATCH);
  return Array.from({ length: count }, (_, i) => `@id${i}`);
}

/**
 * Deletes up to PURGE_BATCH of a queue's dead rows that died at least @olderThanMs (bigint) ago,
 * by the database clock (seconds plus a millisecond remainder: DATEADD takes an int). Returns
 * Deleted.
 */
export function purgeDeadMessages(schema: string): string {
  return `DELETE TOP (${PURGE_BATCH}) FROM ${dead(schema)}
WHERE [Queue] = @queue
  AND [DeadAt] <= DATEADD(millisecond, -CAST(@olderThanMs % 1000 AS int), DATEADD(second, -CAST(@olderThanMs / 1000 AS int), SYSUTCDATETIME()));
SELECT @@ROWCOUNT AS [Deleted];`;
}

/**
 * Messages waiting in the Service Broker queue @queueObject ('[schema].[name]') and dead messages
 * of broker queue @queue. The waiting count is the row count of the queue's internal table
 * (sys.internal_tables QUEUE_MESSAGES, parent_id = the queue's object_id) from sys.partitions: it
 * reads metadata, never the queue (a COUNT(*) over a busy queue scans it and waits on readers).
 * It includes messages received but not yet committed, and needs VIEW DEFINITION on the queue.
 */
export function brokerQueueFigures(schema: string): string {
  return `SELECT
  (SELECT SUM(p.[rows])
   FROM sys.internal_tables AS it
   JOIN sys.partitions AS p ON p.[object_id] = it.[object_id] AND p.[index_id] IN (0, 1)
   WHERE it.[parent_id] = OBJECT_ID(@queueObject) AND it.[internal_type_desc] = N'QUEUE_MESSAGES') AS [MessagesWaiting],
  (SELECT COUNT_BIG(*) FROM ${dead(schema)} WHERE [Queue] = @queue) AS [Dead];`;
}

/**
 * This database's conversation endpoints by state (CONVERSING, DISCONNECTED_INBOUND, CLOSED, …):
 * many DISCONNECTED_INBOUND means a side that never ends its dialogs.
 */
export function conversationEndpointsByState(): string {
  return `SELECT ISNULL([state_desc], [state]) AS [State], COUNT_BIG(*) AS [Count]
FROM sys.conversation_endpoints
GROUP BY ISNULL([state_desc], [state]);`;
}
