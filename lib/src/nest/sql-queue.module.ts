import { Module } from '@nestjs/common';
import { DiscoveryModule } from '@nestjs/core';
import { SchedulerRegistry } from '@nestjs/schedule';
import { SqlQueueConfigError } from '../core/errors.js';
import { SqlQueueConsumerHost } from './consumer.host.js';
import { LeaseReaperScheduler } from './lease-reaper.scheduler.js';
import { QueueProducer } from './queue.producer.js';
import { QueueHandlerExplorer } from './queue-handler.explorer.js';
import { SQL_QUEUE_MODULE_OPTIONS, SqlQueueConfigurableModule } from './sql-queue.module-definition.js';
import { SqlQueueConnectionLifecycle } from './sql-queue.lifecycle.js';
import { resolveModuleOptions, type SqlQueueModuleOptions } from './sql-queue.options.js';
import { BARE_IMPORT, checkBeforeConnecting } from './sql-queue.boot-checks.js';
import { SqlQueueMetrics } from './sql-queue.metrics.js';
import { SqlQueueSchedulerHost } from './schedules.host.js';
import { createSqlQueueRuntime } from './sql-queue.runtime.js';
import { SQL_QUEUE_RUNTIME } from './sql-queue.tokens.js';

/**
 * The queue in a Nest application:
 * `SqlQueueModule.forRoot({ connection, … })` or `forRootAsync({ imports, inject, useFactory })`,
 * imported once, in the application module. Global by default (`isGlobal: false` to opt out):
 * exports QueueProducer and SqlQueueMetrics; runs `@QueueHandler` providers; schedules the lease reaper through
 * `@nestjs/schedule` (import `ScheduleModule.forRoot()` in your app).
 */
@Module({
  imports: [DiscoveryModule],
  providers: [
    {
      provide: SQL_QUEUE_RUNTIME,
      // Optional, so the bare class (imported without forRoot) gets a message naming the fix
      // instead of Nest's "can't resolve dependencies of Symbol(SQL_QUEUE_RUNTIME)".
      inject: [
        { token: SQL_QUEUE_MODULE_OPTIONS, optional: true },
        QueueHandlerExplorer,
        { token: SchedulerRegistry, optional: true },
      ],
      useFactory: (
        raw: SqlQueueModuleOptions | undefined,
        explorer: QueueHandlerExplorer,
        scheduler: SchedulerRegistry | undefined,
      ) => {
        if (raw === undefined) throw new SqlQueueConfigError(BARE_IMPORT);
        const options = resolveModuleOptions(raw);
        const handlers = checkBeforeConnecting(options, explorer, scheduler);
        return createSqlQueueRuntime(options, handlers);
      },
    },
    QueueProducer,
    QueueHandlerExplorer,
    SqlQueueConsumerHost,
    LeaseReaperScheduler,
    SqlQueueConnectionLifecycle,
    SqlQueueMetrics,
    SqlQueueSchedulerHost,
  ],
  exports: [QueueProducer, SqlQueueConsumerHost, SQL_QUEUE_RUNTIME, SqlQueueMetrics],
})
export class SqlQueueModule extends SqlQueueConfigurableModule {}
