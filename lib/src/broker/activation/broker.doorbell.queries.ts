import { quoteMssqlIdentifier } from '../../store/mssql/mssql.identifiers.js';
import { quoteBrokerObject } from '../broker.names.js';
import type { BrokerObjectName, ResolvedBrokerQueue } from '../broker.types.js';

// The table-queue doorbell (broker.doorbell): rings are Service Broker messages whose body is
// the name of a table queue that got work. One named function per statement; values are
// bound parameters.

/**
 * Whether a ring for this table queue already waits: ready to receive in the doorbell queue
 * (status 1), or in BrokerOutbox behind a ring dialog being recycled (its ring goes out only
 * once a listener has ended the old dialog). A producer rings only when none does, so rings
 * cannot pile up while no process listens (every consumer down): the doorbell queue and the
 * outbox hold at most about one ring per table queue. Both read WITH (NOLOCK), as Microsoft
 * advises for queries on queues: it never waits on a listener or a sender (a dirty answer only
 * skips or repeats one ring). The doorbell's queue lives in the module schema (doorbellQueue),
 * as BrokerOutbox does. Params: @doorbell nvarchar (its BrokerOutbox [Queue] name), @ringType
 * nvarchar, @body varbinary. Returns [Pending] 0 or 1.
 */
export function doorbellRingPending(doorbell: ResolvedBrokerQueue): string {
  const outbox = `${quoteMssqlIdentifier(doorbell.queue.schema)}.[BrokerOutbox]`;
  return `SELECT CASE WHEN EXISTS (
  SELECT 1 FROM ${quoteBrokerObject(doorbell.queue)} WITH (NOLOCK)
  WHERE status = 1 AND message_type_name = @ringType AND message_body = @body
) OR EXISTS (
  SELECT 1 FROM ${outbox} WITH (NOLOCK)
  WHERE [Queue] = @doorbell AND [MessageTypeName] = @ringType AND [MessageBody] = @body
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
