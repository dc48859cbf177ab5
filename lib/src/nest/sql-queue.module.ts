import { Module } from '@nestjs/common';
import { DiscoveryModule } from '@nestjs/core';
import { SqlQueueConsumerHost } from './consumer.host.js';
import { LeaseReaperScheduler } from './lease-reaper.scheduler.js';
import { QueueProducer } from './queue.producer.js';
import { QueueHandlerExplorer } from './queue-handler.explorer.js';
import { SQL_QUEUE_MODULE_OPTIONS, SqlQueueConfigurableModule } from './sql-queue.module-definition.js';
import { SqlQueueConnectionLifecycle } from './sql-queue.lifecycle.js';
import type { SqlQueueModuleOptions } from './sql-queue.options.js';
import { SqlQueueMetrics } from './sql-queue.metrics.js';
import { createSqlQueueRuntime } from './sql-queue.runtime.js';
import { SQL_QUEUE_RUNTIME } from './sql-queue.tokens.js';

/**
 * The queue in a Nest application:
 * `SqlQueueModule.forRoot({ connection, … })` or `forRootAsync({ imports, inject, useFactory })`.
 * Exports QueueProducer and SqlQueueMetrics; runs `@QueueHandler` providers; schedules the lease reaper through
 * `@nestjs/schedule` (import `ScheduleModule.forRoot()` in your app).
 */
@Module({
  imports: [DiscoveryModule],
  providers: [
    {
      provide: SQL_QUEUE_RUNTIME,
      inject: [SQL_QUEUE_MODULE_OPTIONS],
      useFactory: (options: SqlQueueModuleOptions) => createSqlQueueRuntime(options),
    },
    QueueProducer,
    QueueHandlerExplorer,
    SqlQueueConsumerHost,
    LeaseReaperScheduler,
    SqlQueueConnectionLifecycle,
    SqlQueueMetrics,
  ],
  exports: [QueueProducer, SqlQueueConsumerHost, SQL_QUEUE_RUNTIME, SqlQueueMetrics],
})
export class SqlQueueModule extends SqlQueueConfigurableModule {}
