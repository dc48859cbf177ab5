import { DiscoveryService } from '@nestjs/core';
import { SqlQueueConfigError } from '../core/errors.js';
import type { JobContext } from '../core/consumer/index.js';
import type { BrokerMessageContext } from '../broker/broker.types.js';
import { validateQueueOptions, type QueueOptions } from '../core/options.js';
import { assertQueueName } from '../core/validation.js';

/** Options a handler can set for its queue; they override the module's `queues` entry. */
export type QueueHandlerOptions = QueueOptions;

export interface QueueHandlerMetadata {
  queue: string;
  options: QueueHandlerOptions;
}

/** What a `@QueueHandler` class of a table queue implements. */
export interface QueueJobHandler<T = unknown, R = void> {
  /**
   * Runs the job. What it resolves with is stored as the job's result (JSON, at most 1 MiB as
   * text: see `getJob()` and `waitFor()`); resolve with nothing for none.
   */
  handle(payload: T, context: JobContext): Promise<R>;
}

/**
 * What a `@QueueHandler` class of a Service Broker queue (declared under the `broker` option)
 * implements: the message body, decoded per the queue's format, and where it came from.
 */
export interface BrokerMessageHandler<T = unknown> {
  handle(body: T, context: BrokerMessageContext): Promise<void>;
}

/**
 * The discoverable metadata `@QueueHandler` sets; the explorer finds providers carrying it.
 * Exported for tooling that lists handlers; applications use `@QueueHandler`.
 */
export const QueueHandlerMarker = DiscoveryService.createDecorator<QueueHandlerMetadata>();

/** Classes decorated in this process, by queue: named in the warning for a queue nothing consumes. */
const declaredClasses = new Map<string, Set<string>>();

/**
 * Marks a provider as the handler of a queue. The class must be a singleton provider (listed in
 * a module's providers, with `@Injectable()`) with an async `handle(payload, context)` method.
 * One handler per queue per application. The queue name and the options are checked when the
 * class is defined, so a mistake there fails at import, before any database is reached.
 *
 * ```ts
 * @QueueHandler('emails', { maxReaders: 10, maxAttempts: 5 })
 * @Injectable()
 * export class SendEmailHandler implements QueueJobHandler<SendEmail> {
 *   async handle(payload: SendEmail, context: JobContext) { … }
 * }
 * ```
 */
export function QueueHandler(queue: string, options: QueueHandlerOptions = {}): ClassDecorator {
  const mark = QueueHandlerMarker({ queue, options }) as ClassDecorator;
  return (target) => {
    checkHandlerDeclaration(queue, options, target.name);
    let names = declaredClasses.get(queue);
    if (!names) declaredClasses.set(queue, (names = new Set()));
    names.add(target.name);
    // Deliberately not @Injectable() as well: that would overwrite a scope the class declares,
    // and hide a request-scoped handler from the check that refuses it.
    return mark(target);
  };
}

/**
 * What a `@QueueHandler` says on its own: a valid queue name and valid options. The decorator
 * checks it at class definition; discovery again, for metadata set through QueueHandlerMarker.
 * Checks that depend on the module's options come at boot, before the database is reached.
 */
export function checkHandlerDeclaration(queue: unknown, options: unknown, className: string): void {
  const where = `@QueueHandler('${String(queue)}') on ${className}`;
  try {
    assertQueueName(queue, SqlQueueConfigError);
  } catch (error) {
    throw new SqlQueueConfigError(`${where}: ${(error as Error).message}`);
  }
  if (options === null || typeof options !== 'object' || Array.isArray(options)) {
    throw new SqlQueueConfigError(`${where}: options must be an object`);
  }
  validateQueueOptions(where, options);
}

/** Every class decorated with `@QueueHandler` in this process, provided in a module or not. */
export function declaredHandlers(): { queue: string; className: string }[] {
  return [...declaredClasses].flatMap(([queue, names]) => [...names].map((className) => ({ queue, className })));
}
