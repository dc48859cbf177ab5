import { Module } from '@nestjs/common';
import { TerminusModule } from '@nestjs/terminus';
import { SqlQueueHealthIndicator } from './sql-queue-health.indicator.js';

/**
 * Provides SqlQueueHealthIndicator. Import it next to `SqlQueueModule.forRoot()` and
 * Terminus's own module, then use the indicator in a controller with `HealthCheckService`:
 *
 * ```ts
 * @Get('health/live') @HealthCheck()
 * live() { return this.health.check([() => this.queue.consumer('queue_consumer')]); }
 * @Get('health/ready') @HealthCheck()
 * ready() { return this.health.check([() => this.queue.database('queue_database', { timeoutMs: 2000 })]); }
 * ```
 */
@Module({
  imports: [TerminusModule],
  providers: [SqlQueueHealthIndicator],
  exports: [SqlQueueHealthIndicator],
})
export class SqlQueueHealthModule {}
