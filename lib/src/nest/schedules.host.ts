import {
  Inject,
  Injectable,
  Logger,
  type BeforeApplicationShutdown,
  type OnApplicationBootstrap,
} from '@nestjs/common';
import { systemClock } from '../core/clock.js';
import { SqlQueueScheduler } from '../core/schedules/index.js';
import { SQL_QUEUE_RUNTIME } from './sql-queue.tokens.js';
import type { SqlQueueRuntime } from './sql-queue.runtime.js';

/**
 * Runs the loop that fires due recurring jobs (`scheduler.enabled`, default on), in every
 * instance: the store's skip-locked firing makes each tick enqueue once however many run. Starts
 * when the application has bootstrapped, stops before connections close. A fired tick wakes its
 * queue's readers here and in other processes, as an enqueue does.
 */
@Injectable()
export class SqlQueueSchedulerHost implements OnApplicationBootstrap, BeforeApplicationShutdown {
  private readonly logger = new Logger('SqlQueue');
  readonly scheduler: SqlQueueScheduler;

  constructor(@Inject(SQL_QUEUE_RUNTIME) private readonly runtime: SqlQueueRuntime) {
    this.scheduler = new SqlQueueScheduler({
      store: runtime.store,
      clock: systemClock,
      logger: this.logger,
      listeners: runtime.listeners,
      maxPollMs: runtime.options.scheduler.maxPollMs,
      defaultMaxAttemptsFor: (queue) => runtime.defaultMaxAttempts(queue),
    });
    runtime.addListener({ scheduleFired: (event) => runtime.producer.wake(event.queue) });
  }

  onApplicationBootstrap(): void {
    if (this.runtime.options.scheduler.enabled) this.scheduler.start();
  }

  async beforeApplicationShutdown(): Promise<void> {
    await this.scheduler.stop();
  }

  /** A schedule was created, changed, resumed or triggered here: look again now, not at the next poll. */
  wake(): void {
    this.scheduler.wake();
  }
}
