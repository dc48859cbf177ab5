import { quoteBrokerObject } from './broker.names.js';
import type { BrokerObjectName } from './broker.types.js';

// The table-queue doorbell (broker.doorbell): rings are Service Broker messages whose body is
// the name of a table queue that got work. One named function per statement; values are
// bound parameters.

/**
 * Whether a ring for this table queue already waits in the doorbell queue (ready to receive,
 * status 1). A producer rings only when none does, so rings cannot pile up while no process
 * listens (every consumer down): the doorbell queue holds at most about one ring per table
 * queue. Read WITH (NOLOCK), as Microsoft advises for queries on queues: it never waits on a
 * listener. Params: @ringType nvarchar, @body varbinary. Returns [Pending] 0 or 1.
 */
export function doorbellRingPending(queue: BrokerObjectName): string {
  return `SELECT CASE WHEN EXISTS (
  SELECT 1 FROM ${quoteBrokerObject(queue)} WITH (NOLOCK)
  WHERE status = 1 AND message_type_name = @ringType AND message_body = @body
) THEN 1 ELSE 0 END AS [Pending];`;
}

/**
 * The listener's wait (a reader connection, in a transaction it always commits): up to 100
 * messages of one conversation group. Params: @timeoutMs int.
 */
export function receiveRings(queue: BrokerObjectName): string {
  return `WAITFOR (
  RECEIVE TOP (100) conversation_handle, message_type_name, message_body
  FROM ${quoteBrokerObject(queue)}
), TIMEOUT @timeoutMs;`;
}
