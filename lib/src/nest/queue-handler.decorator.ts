import { DiscoveryService } from '@nestjs/core';
import type { JobContext } from '../core/handler.js';
import type { QueueOptions } from '../core/options.js';

/** Options a handler can set for its queue; they override the module's `queues` entry. */
export type QueueHandlerOptions = QueueOptions;

export interface QueueHandlerMetadata {
  queue: string;
  options: QueueHandlerOptions;
}

/** What a `@QueueHandler` class implements. */
export interface QueueJobHandler<T = unknown> {
  handle(payload: T, context: JobContext): Promise<void>;
}

/**
 * The discoverable metadata `@QueueHandler` sets; the explorer finds providers carrying it.
 * Exported for tooling that lists handlers; applications use `@QueueHandler`.
 */
export const QueueHandlerMarker = DiscoveryService.createDecorator<QueueHandlerMetadata>();

/**
 * Marks a provider as the handler of a queue. The class must be a singleton provider (listed in
 * a module's providers, with `@Injectable()`) with an async `handle(payload, context)` method.
 * One handler per queue per application.
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
  // Deliberately not @Injectable() as well: that would overwrite a scope the class declares,
  // and hide a request-scoped handler from the check that refuses it.
  return QueueHandlerMarker({ queue, options }) as ClassDecorator;
}
