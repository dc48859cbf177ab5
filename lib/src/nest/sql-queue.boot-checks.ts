import type { SchedulerRegistry } from '@nestjs/schedule';
import { SqlQueueConfigError } from '../core/errors.js';
import { BROKER_NEEDS_SQL_SERVER, splitHandlers } from './broker-handlers.js';
import { resolveHandlerOptions, type QueueHandlerExplorer, type ResolvedHandler } from './queue-handler.explorer.js';
import type { ResolvedModuleOptions } from './sql-queue.options.js';
import { SQL_QUEUE_MODULE_OPTIONS } from './sql-queue.module-definition.js';
import { SQL_QUEUE_RUNTIME } from './sql-queue.tokens.js';

export const BARE_IMPORT =
  'SqlQueueModule is imported without forRoot(): import SqlQueueModule.forRoot({ connection, … }) or SqlQueueModule.forRootAsync({ … }) once, in the application module. It is global, so other modules inject QueueProducer without importing SqlQueueModule';

/**
 * Every boot check that needs no database, run in the runtime's factory before the pool
 * connects: with the database down, a bad handler or a missing ScheduleModule is still
 * reported as itself, not hidden behind a connection error. Returns the declared handlers with
 * their effective options, so the runtime knows them from the first enqueue (a Service Broker
 * queue's handlers too: its messages run as jobs of its table queue).
 *
 * What needs the built handler (its handle() method, request-scoped dependencies) or a factory
 * provider's result is checked at module init (SqlQueueConsumerHost).
 */
export function checkBeforeConnecting(
  options: ResolvedModuleOptions,
  explorer: QueueHandlerExplorer,
  scheduler: SchedulerRegistry | undefined,
): ResolvedHandler[] {
  const runtimes = explorer.countRuntimes(SQL_QUEUE_RUNTIME, SQL_QUEUE_MODULE_OPTIONS);
  // Said first, from every instance: next to a forRoot() in the application module, a bare
  // import of the class is the mistake, not a second forRoot().
  if (runtimes.bare > 0) throw new SqlQueueConfigError(BARE_IMPORT);
  if (runtimes.configured > 1) {
    throw new SqlQueueConfigError(
      'SqlQueueModule.forRoot() is imported more than once in this application: import it once, in the application module (it is global, so other modules need not import it). Handlers are discovered application-wide, so each instance would run every handler; several queue databases in one application are not supported yet',
    );
  }
  const declared = splitHandlers(explorer.findDeclared(), options.broker);
  if (options.broker) {
    const connection = options.connection as { dialect?: unknown; pglite?: unknown };
    if (connection.dialect === 'postgres' || connection.pglite !== undefined) {
      throw new SqlQueueConfigError(BROKER_NEEDS_SQL_SERVER);
    }
  }
  const handlers = [...declared.table, ...declared.broker].map((handler) => ({
    ...handler,
    resolved: resolveHandlerOptions(handler, options),
  }));
  checkScheduleQueues(
    options,
    declared.table.map((handler) => handler.queue),
  );
  if ((options.reaper.enabled || options.retention.enabled) && !scheduler) {
    throw new SqlQueueConfigError(
      'SqlQueueModule schedules its lease reaper with @nestjs/schedule: import ScheduleModule.forRoot() in your application module, or set reaper.enabled and retention.enabled to false',
    );
  }
  return handlers;
}

/**
 * A schedule enqueues into a table queue this application knows: one under `queues` or with a
 * @QueueHandler. A typo in a schedule's queue would otherwise enqueue, on every tick, jobs that
 * nothing ever runs.
 */
export function checkScheduleQueues(options: ResolvedModuleOptions, handlerQueues: readonly string[]): void {
  const known = new Set([...Object.keys(options.queues), ...handlerQueues]);
  for (const [id, definition] of Object.entries(options.schedules)) {
    const message = unknownScheduleQueue(id, definition.queue, known, options);
    if (message) throw new SqlQueueConfigError(message);
  }
}

/** Why `queue` cannot take schedule `id`'s jobs, or null when it can. */
export function unknownScheduleQueue(
  id: string,
  queue: string,
  known: ReadonlySet<string>,
  options: ResolvedModuleOptions,
): string | null {
  if (options.broker?.queues.some((q) => q.name === queue)) {
    return `schedule '${id}': '${queue}' is a Service Broker queue; schedules enqueue into table queues`;
  }
  if (known.has(queue)) return null;
  const names = [...known].map((name) => `'${name}'`).join(', ') || 'none';
  return `schedule '${id}': queue '${queue}' is unknown to this application (known: ${names}): declare it under queues (queues: { '${queue}': {} }) if another process consumes it, or give it a @QueueHandler`;
}
