import { Controller, Get, Inject } from '@nestjs/common';
import { HealthCheck, HealthCheckService } from '@nestjs/terminus';
import { SqlQueueHealthIndicator } from 'nestjs-sql-queue/health';
import { SAMPLE_CONFIG, type SampleConfig } from '../app.config.js';
import { EMAILS_QUEUE } from '../emails/send-email.job.js';

/**
 * Kubernetes probes. Liveness asks only whether this process's consumer is alive (no database
 * round trip: a database outage must not restart every pod); readiness asks whether the
 * database answers in time (an instance that cannot reach it should get no traffic).
 * Backlog is for dashboards and alerts, never a probe: restarting pods does not drain a queue.
 */
@Controller('health')
export class HealthController {
  constructor(
    private readonly health: HealthCheckService,
    private readonly queue: SqlQueueHealthIndicator,
    @Inject(SAMPLE_CONFIG) private readonly config: SampleConfig,
  ) {}

  @Get('live')
  @HealthCheck()
  live() {
    return this.health.check([() => this.queue.consumer('queue_consumer')]);
  }

  @Get('ready')
  @HealthCheck()
  ready() {
    return this.health.check([
      () => this.queue.database('queue_database', { timeoutMs: this.config.readinessTimeoutMs }),
    ]);
  }

  @Get('backlog')
  @HealthCheck()
  backlog() {
    return this.health.check([
      () =>
        this.queue.backlog('emails_backlog', {
          queue: EMAILS_QUEUE,
          maxOldestReadyAgeMs: 5 * 60_000,
          maxExpiredLeases: 10,
          maxDead: 100,
        }),
    ]);
  }
}
