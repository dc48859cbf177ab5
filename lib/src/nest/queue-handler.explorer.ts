import { Injectable, Scope } from '@nestjs/common';
import { DiscoveryService } from '@nestjs/core';
import type { InstanceWrapper } from '@nestjs/core/injector/instance-wrapper.js';
import { SqlQueueConfigError } from '../core/errors.js';
import { resolveQueueOptions, type ResolvedQueueOptions } from '../core/options.js';
import {
  checkHandlerDeclaration,
  QueueHandlerMarker,
  type QueueHandlerOptions,
  type QueueJobHandler,
} from './queue-handler.decorator.js';
import type { ResolvedModuleOptions } from './sql-queue.options.js';

/** A `@QueueHandler` provider as declared: known before any provider is instantiated. */
export interface DeclaredHandler {
  queue: string;
  options: QueueHandlerOptions;
  className: string;
}

export interface DiscoveredHandler extends DeclaredHandler {
  instance: QueueJobHandler;
}

/** A handler with the options it runs with. */
export interface ResolvedHandler extends DeclaredHandler {
  resolved: ResolvedQueueOptions;
}

/**
 * Finds `@QueueHandler` providers and checks them; it owns no runtime objects. Every problem
 * fails the boot with the class name and what to change.
 *
 * It runs twice. `findDeclared()` runs in the runtime's factory, before the database is reached:
 * providers exist then, but none is instantiated (class providers are bare prototypes, factory
 * providers nothing yet), so it checks what needs no instance. `discover()` runs at module init,
 * once every provider is built, and checks the rest (the handle() method, request-scoped
 * dependencies) and finds handlers that only a factory provider yields.
 */
@Injectable()
export class QueueHandlerExplorer {
  constructor(private readonly discovery: DiscoveryService) {}

  findDeclared(): DeclaredHandler[] {
    return this.find().map(({ queue, options, className }) => ({ queue, options, className }));
  }

  discover(): DiscoveredHandler[] {
    return this.find().map(({ wrapper, ...handler }) => {
      const where = `@QueueHandler('${handler.queue}') on ${handler.className}`;
      // Only now: this walks the dependency tree and caches its answer in the wrapper, so it
      // must not run before Nest has resolved the handler's dependencies.
      if (!wrapper.isDependencyTreeStatic()) {
        throw new SqlQueueConfigError(`${where}: ${NOT_SINGLETON} (or depends on one); ${RUNS_OUTSIDE_REQUESTS}`);
      }
      const instance = wrapper.instance as Partial<QueueJobHandler> | undefined;
      if (!instance || typeof instance.handle !== 'function') {
        throw new SqlQueueConfigError(`${where}: the class has no handle(payload, context) method`);
      }
      return { ...handler, instance: instance as QueueJobHandler };
    });
  }

  /**
   * The SqlQueueModule instances of the application: `configured` by forRoot()/forRootAsync()
   * (their module provides `optionsToken`), and `bare` imports of the class. Handlers are
   * discovered application-wide, so a second instance would run every handler twice.
   */
  countRuntimes(token: symbol, optionsToken: unknown): { configured: number; bare: number } {
    const hosts = this.discovery.getProviders().filter((wrapper) => wrapper.token === token);
    const configured = hosts.filter((wrapper) => wrapper.host?.providers.has(optionsToken as string)).length;
    return { configured, bare: hosts.length - configured };
  }

  private find(): (DeclaredHandler & { wrapper: InstanceWrapper })[] {
    const byQueue = new Map<string, DeclaredHandler & { wrapper: InstanceWrapper; instance: unknown }>();
    // Every provider, not the decorator's index: that index lists only the exact class the
    // decorator ran on, so a subclass provided with useClass would be missed without a word.
    // The metadata lookup follows the prototype chain, so inherited @QueueHandler counts.
    for (const wrapper of this.discovery.getProviders()) {
      // A value provider may be null, undefined or prototype-less: no class, so no handler.
      // Before instantiation a class provider's instance is its bare prototype, whose
      // constructor is the class (a useClass subclass included).
      const target =
        (wrapper.instance as { constructor?: unknown } | null | undefined)?.constructor ?? wrapper.metatype;
      if (typeof target !== 'function') continue;
      const metadata = this.discovery.getMetadataByDecorator(QueueHandlerMarker, wrapper);
      if (!metadata) continue;
      const className = (wrapper.metatype as { name?: string } | undefined)?.name ?? String(wrapper.name);
      // Also here, not only in the decorator: QueueHandlerMarker can set the metadata directly.
      checkHandlerDeclaration(metadata.queue, metadata.options, className);
      if (wrapper.scope === Scope.REQUEST || wrapper.isTransient) {
        throw new SqlQueueConfigError(
          `@QueueHandler('${metadata.queue}') on ${className}: ${NOT_SINGLETON}; ${RUNS_OUTSIDE_REQUESTS}`,
        );
      }
      const handler = { queue: metadata.queue, options: metadata.options, className, wrapper };
      // The same instance seen twice (an alias of the provider) is one handler. Before
      // instantiation every class provider has a prototype of its own, so this holds then too.
      const instance = wrapper.instance;
      const existing = byQueue.get(handler.queue);
      if (existing && existing.instance !== instance) {
        throw new SqlQueueConfigError(
          existing.className === handler.className
            ? `queue '${handler.queue}' has two handlers: ${handler.className} is provided in two modules; provide it in one`
            : `queue '${handler.queue}' has two handlers, ${existing.className} and ${handler.className}: one queue has one handler (route by payload inside it, or use two queues)`,
        );
      }
      byQueue.set(handler.queue, { ...handler, instance });
    }
    return [...byQueue.values()].map(({ instance: _instance, ...handler }) => handler);
  }
}

const NOT_SINGLETON = 'handlers must be singleton providers, but this one is request-scoped or transient';
const RUNS_OUTSIDE_REQUESTS = 'jobs run outside any request';

/**
 * A handler's effective options: its decorator over the module's `queues` entry (for a Service
 * Broker queue: its `broker.queues` entry, with the broker defaults) over the consumer defaults.
 * Needs no database, so it runs before the connection too.
 */
export function resolveHandlerOptions(handler: DeclaredHandler, options: ResolvedModuleOptions): ResolvedQueueOptions {
  const broker = options.broker?.queues.find((queue) => queue.name === handler.queue);
  return resolveQueueOptions(
    handler.queue,
    { module: broker ? broker.handlerOptions : options.queues[handler.queue], handler: handler.options },
    options.consumer,
    `@QueueHandler('${handler.queue}') on ${handler.className}`,
  );
}
