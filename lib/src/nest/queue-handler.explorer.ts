import { Injectable } from '@nestjs/common';
import { DiscoveryService } from '@nestjs/core';
import type { InstanceWrapper } from '@nestjs/core/injector/instance-wrapper.js';
import { SqlQueueConfigError } from '../core/errors.js';
import { assertQueueName } from '../core/validation.js';
import { QueueHandlerMarker, type QueueHandlerOptions, type QueueJobHandler } from './queue-handler.decorator.js';

export interface DiscoveredHandler {
  queue: string;
  options: QueueHandlerOptions;
  className: string;
  instance: QueueJobHandler;
}

/**
 * Finds `@QueueHandler` providers and checks them; it owns no runtime objects. Every problem
 * fails the boot with the class name and what to change.
 */
@Injectable()
export class QueueHandlerExplorer {
  constructor(private readonly discovery: DiscoveryService) {}

  discover(): DiscoveredHandler[] {
    const byQueue = new Map<string, DiscoveredHandler>();
    // Every provider, not the decorator's index: that index lists only the exact class the
    // decorator ran on, so a subclass provided with useClass would be missed without a word.
    // The metadata lookup follows the prototype chain, so inherited @QueueHandler counts.
    for (const wrapper of this.discovery.getProviders()) {
      // A value provider may be null, undefined or prototype-less: no class, so no handler.
      const target =
        (wrapper.instance as { constructor?: unknown } | null | undefined)?.constructor ?? wrapper.metatype;
      if (typeof target !== 'function') continue;
      const metadata = this.discovery.getMetadataByDecorator(QueueHandlerMarker, wrapper);
      if (!metadata) continue;
      const handler = this.check(wrapper, metadata.queue, metadata.options);
      const existing = byQueue.get(handler.queue);
      if (existing && existing.instance !== handler.instance) {
        throw new SqlQueueConfigError(
          existing.className === handler.className
            ? `queue '${handler.queue}' has two handlers: ${handler.className} is provided in two modules; provide it in one`
            : `queue '${handler.queue}' has two handlers, ${existing.className} and ${handler.className}: one queue has one handler (route by payload inside it, or use two queues)`,
        );
      }
      byQueue.set(handler.queue, handler);
    }
    return [...byQueue.values()];
  }

  /**
   * How many SqlQueueModule runtimes the application holds. Handlers are discovered
   * application-wide, so a second forRoot() would run every handler twice.
   */
  countRuntimes(token: symbol): number {
    return this.discovery.getProviders().filter((wrapper) => wrapper.token === token).length;
  }

  private check(wrapper: InstanceWrapper, queue: string, options: QueueHandlerOptions): DiscoveredHandler {
    const className = (wrapper.metatype as { name?: string } | undefined)?.name ?? String(wrapper.name);
    const where = `@QueueHandler('${String(queue)}') on ${className}`;
    try {
      assertQueueName(queue, SqlQueueConfigError);
    } catch (error) {
      throw new SqlQueueConfigError(`${where}: ${(error as Error).message}`);
    }
    if (!wrapper.isDependencyTreeStatic() || wrapper.isTransient) {
      throw new SqlQueueConfigError(
        `${where}: handlers must be singleton providers, but this one is request-scoped or transient (or depends on one); jobs run outside any request`,
      );
    }
    const instance = wrapper.instance as Partial<QueueJobHandler> | undefined;
    if (!instance || typeof instance.handle !== 'function') {
      throw new SqlQueueConfigError(`${where}: the class has no handle(payload, context) method`);
    }
    if (options === null || typeof options !== 'object') {
      throw new SqlQueueConfigError(`${where}: options must be an object`);
    }
    return { queue, options, className, instance: instance as QueueJobHandler };
  }
}
