import { Module } from '@nestjs/common';
import { DiscoveryModule } from '@nestjs/core';
import { SqlQueueConfigError } from '../core/errors.js';
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

const BARE_IMPORT =
  'SqlQueueModule is imported without forRoot(): import SqlQueueModule.forRoot({ connection, … }) or SqlQueueModule.forRootAsync({ … }) once, in the application module. It is global, so other modules inject QueueProducer without importing SqlQueueModule';

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
      inject: [{ token: SQL_QUEUE_MODULE_OPTIONS, optional: true }],
      useFactory: (options: SqlQueueModuleOptions | undefined) => {
        if (options === undefined) throw new SqlQueueConfigError(BARE_IMPORT);
        return createSqlQueueRuntime(options);
      },
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
