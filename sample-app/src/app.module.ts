import { Module, type DynamicModule } from '@nestjs/common';
import { APP_FILTER } from '@nestjs/core';
import { ScheduleModule } from '@nestjs/schedule';
import { TerminusModule } from '@nestjs/terminus';
import { SqlQueueModule } from 'nestjs-sql-queue';
import { SqlQueueDashboardModule } from 'nestjs-sql-queue/dashboard';
import { SqlQueueHealthModule } from 'nestjs-sql-queue/health';
import { SqlQueuePrometheusModule } from 'nestjs-sql-queue/prometheus';
import { SAMPLE_CONFIG, type SampleConfig } from './app.config.js';
import {
  DASHBOARD_PATH,
  DashboardAccessNotice,
  DashboardBasicAuthGuard,
} from './dashboard/dashboard-basic-auth.guard.js';
import { openSampleDatabase, SampleDatabase } from './database/sample.database.js';
import { EmailReceiver } from './emails/email-receiver.service.js';
import { EmailsController } from './emails/emails.controller.js';
import { SendEmailHandler } from './emails/send-email.handler.js';
import { HealthController } from './health/health.controller.js';
import { MetricsController } from './metrics/metrics.controller.js';
import { QueuesController } from './queues/queues.controller.js';
import { SignupsController } from './signups/signups.controller.js';
import { SqlQueueValidationFilter } from './sql-queue-error.filter.js';

/** The configuration and the database, shared by the app's providers and the queue module. */
@Module({})
class SampleCoreModule {
  static forRoot(config: SampleConfig): DynamicModule {
    return {
      module: SampleCoreModule,
      global: true,
      providers: [
        { provide: SAMPLE_CONFIG, useValue: config },
        // Async: an unreachable database or a failed table setup fails the boot, not a request.
        { provide: SampleDatabase, useFactory: () => openSampleDatabase(config) },
      ],
      exports: [SAMPLE_CONFIG, SampleDatabase],
    };
  }
}

/**
 * The sample application: emails go through the queue, signups commit a row and its welcome
 * email together, health endpoints for Kubernetes, metrics for Prometheus, the queue dashboard.
 */
@Module({})
export class AppModule {
  static forRoot(config: SampleConfig): DynamicModule {
    return {
      module: AppModule,
      imports: [
        SampleCoreModule.forRoot(config),
        // The application's own scheduler; the queue registers its reaper on it.
        ScheduleModule.forRoot(),
        TerminusModule,
        SqlQueueModule.forRootAsync({
          inject: [SampleDatabase],
          useFactory: (db: SampleDatabase) => ({
            connection: db.queueConnection,
            schema: config.queueSchema,
            consumer: { shutdownTimeoutMs: config.shutdownTimeoutMs },
            metrics: { cacheMs: config.metricsCacheMs, timeoutMs: config.metricsTimeoutMs },
          }),
        }),
        SqlQueueHealthModule,
        SqlQueuePrometheusModule.forRoot({}),
        // The queue dashboard, behind a demo HTTP Basic guard (DASHBOARD_PASSWORD).
        SqlQueueDashboardModule.forRoot({ path: DASHBOARD_PATH, guard: DashboardBasicAuthGuard }),
      ],
      controllers: [EmailsController, SignupsController, QueuesController, HealthController, MetricsController],
      providers: [
        EmailReceiver,
        SendEmailHandler,
        DashboardAccessNotice,
        { provide: APP_FILTER, useClass: SqlQueueValidationFilter },
      ],
    };
  }
}
