import {
  Inject,
  Injectable,
  Logger,
  type BeforeApplicationShutdown,
  type OnApplicationBootstrap,
  type OnModuleInit,
} from '@nestjs/common';
import { systemClock } from '../core/clock.js';
import { SqlQueueConsumer, type ConsumerSnapshot } from '../core/consumer/index.js';
import type { ResolvedQueueOptions } from '../core/options.js';
import { splitHandlers } from './broker-handlers.js';
import { declaredHandlers, type BrokerMessageHandler } from './queue-handler.decorator.js';
import { QueueHandlerExplorer, resolveHandlerOptions } from './queue-handler.explorer.js';
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
      const { consumer, queues } = this.prepareConsumer();
      this.consumer = consumer;
      // Recorded before connecting already, except handlers that only a factory provider yields.
      await this.runtime.recordQueueSettings(queues);
    } catch (error) {
      await this.runtime.failBoot(error);
    }
  }

  /** The second-instance, option and ScheduleModule checks ran before connecting (checkBeforeConnecting). */
  private prepareConsumer(): { consumer: SqlQueueConsumer; queues: ResolvedQueueOptions[] } {
    const { options } = this.runtime;
    const { table: handlers, broker: brokerHandlers } = splitHandlers(this.explorer.discover(), options.broker);
    const consumer = new SqlQueueConsumer({
      store: this.runtime.store,
      clock: systemClock,
      logger: this.logger,
      listeners: this.runtime.listeners,
      wakeBus: this.runtime.wakeBus,
      listen: this.runtime.wakeChannel.listen,
      workerId: this.runtime.workerId,
      tracer: this.runtime.tracer,
    });
    const queues = handlers.map((handler) => {
      const resolved = resolveHandlerOptions(handler, options);
      this.runtime.handlerOptions.set(handler.queue, handler.options);
      consumer.register(resolved, (payload, context) => handler.instance.handle(payload, context));
      return resolved;
    });
    for (const handler of brokerHandlers) {
      // A broker queue's messages run as jobs of its table queue; its receivers move them there.
      const resolved = resolveHandlerOptions(handler, options);
      const instance = handler.instance as unknown as BrokerMessageHandler;
      const broker = this.runtime.broker!;
      consumer.register(
        resolved,
        broker.jobHandler(handler.queue, (body, context) => instance.handle(body, context)),
      );
      if (options.consumer.enabled) broker.register(handler.queue, { maxAttempts: resolved.maxAttempts });
      queues.push(resolved);
    }
    if (options.consumer.enabled) {
      this.warnUnconsumed([...handlers, ...brokerHandlers].map((handler) => handler.queue));
    } else if (handlers.length + brokerHandlers.length > 0) {
      this.logger.log(
        `consumer disabled: ${handlers.length + brokerHandlers.length} handler(s) discovered but not started`,
      );
    }
    return { consumer, queues };
  }

  /**
   * A queue nobody consumes looks, from the producer's side, exactly like a working one: jobs
   * just wait. Most often a @QueueHandler class that no module lists in its providers (never
   * instantiated, so never discovered). Said at boot, naming such classes.
   */
  private warnUnconsumed(consumed: string[]): void {
    const unprovided = declaredHandlers().filter((declared) => !consumed.includes(declared.queue));
    const notProvided = (classes: typeof unprovided) =>
      `${classes.map((c) => `${c.className} has @QueueHandler('${c.queue}')`).join(', ')} but ${classes.length === 1 ? 'is' : 'are'} in no module's providers`;
    if (consumed.length === 0) {
      this.logger.warn(
        `no @QueueHandler provider in this application, so this process consumes no queue: list handler classes in a module's providers, or set consumer.enabled: false in a producer-only process${unprovided.length > 0 ? ` (${notProvided(unprovided)})` : ''}`,
      );
    }
    for (const queue of Object.keys(this.runtime.options.queues)) {
      if (consumed.includes(queue)) continue;
      const classes = unprovided.filter((declared) => declared.queue === queue);
      this.logger.warn(
        `queue '${queue}' is configured in queues but this process does not consume it: ${
          classes.length > 0
            ? notProvided(classes)
            : `no provider has @QueueHandler('${queue}') (fine if another process consumes it)`
        }`,
      );
    }
  }

  async onApplicationBootstrap(): Promise<void> {
    if (this.enabled && this.consumer) {
      await this.consumer.start();
      // Waiters in other processes ask for the jobs they wait for; this process's finishes answer.
      // Not awaited: it joins the readers' channel, and only waitFor's latency depends on it.
      if (this.consumer.queueNames.length > 0) void this.runtime.finishWatch.listen({ consuming: true });
    }
    // In a producer-only process too: the initiator side ends the dialogs that targets end.
    await this.runtime.broker?.start();
  }

  async beforeApplicationShutdown(): Promise<void> {
    const timeoutMs = this.runtime.options.consumer.shutdownTimeoutMs;
    await Promise.all([this.consumer?.stop(timeoutMs), this.runtime.broker?.stop(timeoutMs)]);
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
