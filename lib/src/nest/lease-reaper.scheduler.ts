import {
  Inject,
  Injectable,
  Logger,
  Optional,
  type BeforeApplicationShutdown,
  type OnApplicationBootstrap,
} from '@nestjs/common';
import { SchedulerRegistry } from '@nestjs/schedule';
import { SqlQueueConfigError } from '../core/errors.js';
import { ThrottledErrorLog } from '../core/logger.js';
import { cleanupFinishedJobs, reapExpiredLeases, repairGroups } from '../core/maintenance/index.js';
import { settleWithin } from '../core/timeout.js';
import { SQL_QUEUE_RUNTIME } from './sql-queue.tokens.js';
import type { SqlQueueRuntime } from './sql-queue.runtime.js';

/** Reaper runs per run of the ordered groups' repair sweep. */
const REPAIR_EVERY = 12;

/**
 * Schedules the lease reaper (with the ordered groups' repair sweep) and retention cleanup through the application's
 * SchedulerRegistry. The library never calls ScheduleModule.forRoot() itself: a second call
 * would run the application's own @Cron/@Interval jobs twice. Runs never overlap, errors are
 * logged (throttled) and never escape the timer, and every instance may run it at once.
 * A missing SchedulerRegistry is refused before the database is reached (checkBeforeConnecting).
 */
@Injectable()
export class LeaseReaperScheduler implements OnApplicationBootstrap, BeforeApplicationShutdown {
  private readonly logger = new Logger('SqlQueue');
  private readonly names: string[] = [];
  private readonly inFlight = new Set<Promise<void>>();

  constructor(
    @Inject(SQL_QUEUE_RUNTIME) private readonly runtime: SqlQueueRuntime,
    @Optional() private readonly registry?: SchedulerRegistry,
  ) {}

  onApplicationBootstrap(): void {
    const { reaper, retention, schema } = this.runtime.options;
    if (!reaper.enabled && !retention.enabled) return;
    if (reaper.enabled) {
      const errors = new ThrottledErrorLog(this.logger, 'lease reaper', Date.now);
      let runs = 0;
      this.schedule(
        `nestjs-sql-queue:${schema}:lease-reaper`,
        reaper.intervalMs,
        async () => {
          const reaped = await this.runtime.tracer.reap(() => reapExpiredLeases(this.runtime.store, reaper.batchSize));
          errors.succeeded();
          this.runtime.throughput?.reaped(reaped);
          for (const job of reaped) {
            const message = `job ${job.id} in queue '${job.queue}': lease expired (attempt ${job.attempt}), ${job.state === 'dead' ? 'moved to dead, no attempts left' : 'returned to ready'}`;
            if (job.state === 'dead') this.logger.error(message);
            else this.logger.warn(message);
          }
          // The repair sweep is a safety net, not a path jobs depend on: at boot, then every
          // REPAIR_EVERY runs (a minute at the default interval), one statement when all is well.
          if (runs++ % REPAIR_EVERY !== 0) return;
          const repairs = await repairGroups(this.runtime.store, reaper.batchSize, this.runtime.options.listeners);
          for (const repair of repairs) {
            this.logger.error(
              `ordered group '${repair.groupKey}' in queue '${repair.queue}': ${repair.problem}; repaired (a bug or a manual edit: please report it)`,
            );
          }
        },
        errors,
      );
    }
    if (retention.enabled) {
      const errors = new ThrottledErrorLog(this.logger, 'retention cleanup', Date.now);
      this.schedule(
        `nestjs-sql-queue:${schema}:retention`,
        retention.intervalMs,
        async () => {
          const deleted = await cleanupFinishedJobs(this.runtime.store, retention);
          errors.succeeded();
          if (deleted > 0) this.logger.debug(`retention cleanup deleted ${deleted} finished job(s)`);
        },
        errors,
      );
    }
  }

  private schedule(name: string, intervalMs: number, task: () => Promise<void>, errors: ThrottledErrorLog): void {
    let running = false;
    const tick = () => {
      if (running) return; // a slow run is still going: skip this tick rather than pile up
      running = true;
      const run = task()
        .catch((error: unknown) => errors.failed(error, intervalMs))
        .finally(() => {
          running = false;
          this.inFlight.delete(run);
        });
      this.inFlight.add(run);
    };
    if (this.registry!.doesExist('interval', name)) {
      throw new SqlQueueConfigError(
        `an interval named '${name}' is already registered: SqlQueueModule for schema '${this.runtime.options.schema}' is imported more than once`,
      );
    }
    const handle = setInterval(tick, intervalMs);
    handle.unref();
    this.registry!.addInterval(name, handle);
    this.names.push(name);
    tick(); // recover leases left by a crash right away, not one interval later
  }

  /** Before connections close: no new runs, and the one in flight finishes. */
  async beforeApplicationShutdown(): Promise<void> {
    for (const name of this.names.splice(0)) {
      if (this.registry?.doesExist('interval', name)) this.registry.deleteInterval(name);
    }
    // Bounded: a run stuck on a dead connection must not hold shutdown.
    if (!(await settleWithin(Promise.all([...this.inFlight]), 10_000))) {
      this.logger.warn('a reaper or retention run was still in flight at shutdown');
    }
  }
}
