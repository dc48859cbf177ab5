import { retryDelayFor } from '../core/backoff.js';
import { SqlQueueConfigError } from '../core/errors.js';
import type { QueueOptions } from '../core/options.js';
import type { ResolvedBrokerOptions } from '../broker/broker.types.js';
import type { DeclaredHandler } from './queue-handler.explorer.js';

export const BROKER_NEEDS_SQL_SERVER =
  'broker: Service Broker queues need SQL Server (or Azure SQL Managed Instance), and this connection is PostgreSQL: remove the broker option, or use table queues (queues) on PostgreSQL';

/** `@QueueHandler` options a Service Broker queue takes; the rest belong to table queues. */
const BROKER_HANDLER_OPTIONS = ['minReaders', 'maxReaders', 'maxAttempts', 'maxDurationMs', 'backoff'] as const;

/** Handlers of table queues and of broker queues, apart. */
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

/**
 * Applies a broker queue handler's decorator options over its `broker.queues` entry (the
 * handler wins, as for table queues). Options that only mean something for a table queue
 * (leases, claims, polling, groups) fail the boot instead of being ignored.
 */
export function applyBrokerHandlerOptions(broker: ResolvedBrokerOptions, handler: DeclaredHandler): void {
  const where = `@QueueHandler('${handler.queue}') on ${handler.className}`;
  const queue = broker.queues.find((candidate) => candidate.name === handler.queue);
  if (!queue) throw new SqlQueueConfigError(`${where}: '${handler.queue}' is not a broker queue`);
  const options: QueueOptions = handler.options;
  const foreign = Object.keys(options).filter((key) => !(BROKER_HANDLER_OPTIONS as readonly string[]).includes(key));
  if (foreign.length > 0) {
    throw new SqlQueueConfigError(
      `${where}: ${foreign.map((key) => `'${key}'`).join(', ')} ${foreign.length === 1 ? 'applies' : 'apply'} to table queues only; a Service Broker queue takes ${BROKER_HANDLER_OPTIONS.join(', ')} here, and the rest under broker.queues['${handler.queue}']`,
    );
  }
  const minReaders = options.minReaders ?? queue.minReaders;
  const maxReaders = options.maxReaders ?? Math.max(queue.maxReaders, minReaders);
  if (minReaders > maxReaders) {
    throw new SqlQueueConfigError(`${where}: minReaders (${minReaders}) is greater than maxReaders (${maxReaders})`);
  }
  queue.minReaders = minReaders;
  queue.maxReaders = maxReaders;
  if (options.maxAttempts !== undefined) queue.maxAttempts = options.maxAttempts;
  if (options.maxDurationMs !== undefined) queue.maxDurationMs = options.maxDurationMs;
  if (options.backoff !== undefined) queue.retryDelay = retryDelayFor(options.backoff, where);
}
