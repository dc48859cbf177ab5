import {
  Inject,
  Injectable,
  Logger,
  type BeforeApplicationShutdown,
  type OnApplicationBootstrap,
  type OnModuleInit,
} from '@nestjs/common';
import { systemClock } from '../core/clock.js';
import { SqlQueueConsumer, type ConsumerSnapshot } from '../core/consumer.js';
import { SqlQueueConfigError } from '../core/errors.js';
import { resolveQueueOptions } from '../core/options.js';
import { QueueHandlerExplorer } from './queue-handler.explorer.js';
import { SQL_QUEUE_RUNTIME } from './sql-queue.tokens.js';
import type { SqlQueueRuntime } from './sql-queue.runtime.js';

/**
 * Owns the consumer: discovers and checks handlers at module init (so a job enqueued during
 * another provider's init already gets its handler's options, and a bad setup fails before the
 * reaper starts), starts readers when the application has bootstrapped, and on shutdown stops
 * claiming and drains running handlers (up to `consumer.shutdownTimeoutMs`) before connections close.
 */
@Injectable()
export class SqlQueueConsumerHost implements OnModuleInit, OnApplicationBootstrap, BeforeApplicationShutdown {
  private readonly logger = new Logger('SqlQueue');
  private consumer: SqlQueueConsumer | null = null;

  constructor(
    @Inject(SQL_QUEUE_RUNTIME) private readonly runtime: SqlQueueRuntime,
    private readonly explorer: QueueHandlerExplorer,
  ) {}

  async onModuleInit(): Promise<void> {
    try {
      this.consumer = this.prepareConsumer();
    } catch (error) {
      await this.runtime.failBoot(error);
    }
  }

  private prepareConsumer(): SqlQueueConsumer {
    const { options } = this.runtime;
    if (this.explorer.countRuntimes(SQL_QUEUE_RUNTIME) > 1) {
      throw new SqlQueueConfigError(
        'SqlQueueModule.forRoot() is imported more than once in this application: import it once (isGlobal: true, or from one shared module). Handlers are discovered application-wide, so each instance would run every handler; several queue databases in one application are not supported yet',
      );
    }
    const handlers = this.explorer.discover();
    const consumer = new SqlQueueConsumer({
      store: this.runtime.store,
      clock: systemClock,
      logger: this.logger,
      listeners: this.runtime.listeners,
      wakeBus: this.runtime.wakeBus,
      workerId: this.runtime.workerId,
    });
    for (const handler of handlers) {
      const resolved = resolveQueueOptions(
        handler.queue,
        { module: options.queues[handler.queue], handler: handler.options },
        options.consumer,
        `@QueueHandler('${handler.queue}') on ${handler.className}`,
      );
      this.runtime.handlerOptions.set(handler.queue, handler.options);
      consumer.register(resolved, (payload, context) => handler.instance.handle(payload, context));
    }
    for (const queue of Object.keys(options.queues)) {
      if (options.consumer.enabled && handlers.length > 0 && !handlers.some((h) => h.queue === queue)) {
        this.logger.warn(`queue '${queue}' is configured but has no @QueueHandler in this application`);
      }
    }
    if (!options.consumer.enabled && handlers.length > 0) {
      this.logger.log(`consumer disabled: ${handlers.length} handler(s) discovered but not started`);
    }
    return consumer;
  }

  async onApplicationBootstrap(): Promise<void> {
    if (this.enabled) await this.consumer?.start();
  }

  async beforeApplicationShutdown(): Promise<void> {
    await this.consumer?.stop(this.runtime.options.consumer.shutdownTimeoutMs);
  }

  /** For liveness checks: is the consumer running, and are its readers making progress? */
  snapshot(): ConsumerSnapshot {
    // A producer-only process has no readers to report (their figures would page someone).
    if (!this.enabled || !this.consumer) return { running: false, startedAt: null, queues: [] };
    return this.consumer.snapshot();
  }

  /** False when `consumer.enabled` is off: this process only produces. */
  get enabled(): boolean {
    return this.runtime.options.consumer.enabled;
  }
}
