// Figures of a broker queue and of this database's conversations: one function per statement,
// SQL text only, every value a parameter. (Dead messages are dead jobs of the broker queue's
// table queue: the store lists, retries and purges them.)

/**
 * Messages waiting in the Service Broker queue @queueObject ('[schema].[name]'): the row count
 * of the queue's internal table (sys.internal_tables QUEUE_MESSAGES, parent_id = the queue's
 * object_id) from sys.partitions. It reads metadata, never the queue (a COUNT(*) over a busy
 * queue scans it and waits on readers). It includes messages received by a move that has not
 * committed yet, and needs VIEW DEFINITION on the queue.
 */
export function brokerQueueFigures(): string {
  return `SELECT
  (SELECT SUM(p.[rows])
   FROM sys.internal_tables AS it
   JOIN sys.partitions AS p ON p.[object_id] = it.[object_id] AND p.[index_id] IN (0, 1)
   WHERE it.[parent_id] = OBJECT_ID(@queueObject) AND it.[internal_type_desc] = N'QUEUE_MESSAGES') AS [MessagesWaiting];`;
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
