import type { ResolvedBrokerOptions } from '../broker/broker.types.js';
import type { DeclaredHandler } from './queue-handler.explorer.js';

export const BROKER_NEEDS_SQL_SERVER =
  'broker: Service Broker queues need SQL Server (or Azure SQL Managed Instance), and this connection is PostgreSQL: remove the broker option, or use table queues (queues) on PostgreSQL';

/**
 * Handlers of table queues and of broker queues, apart. Both run as table-queue jobs; a broker
 * queue's also gets receivers, which move its messages into its table queue.
 */
export function splitHandlers<H extends DeclaredHandler>(
  handlers: readonly H[],
  broker: ResolvedBrokerOptions | null,
): { table: H[]; broker: H[] } {
  const names = new Set(broker?.queues.map((queue) => queue.name) ?? []);
  return {
    table: handlers.filter((handler) => !names.has(handler.queue)),
    broker: handlers.filter((handler) => names.has(handler.queue)),
  };
}
