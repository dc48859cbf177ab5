import { ConfigurableModuleBuilder } from '@nestjs/common';
import type { Registry } from 'prom-client';

/** Options of `SqlQueuePrometheusModule.forRoot()` / `forRootAsync()`. */
export interface SqlQueuePrometheusOptions {
  /**
   * Registry to register the queue's metrics on, e.g. prom-client's global `register` to serve
   * them with your own metrics. Default: a registry of the exporter's own (`exporter.registry`).
   */
  registry?: Registry;
  /** Metric name prefix (default 'sqlqueue_'). */
  prefix?: string;
}

/** forRoot / forRootAsync and the options token come from Nest's builder. */
export const {
  ConfigurableModuleClass: SqlQueuePrometheusConfigurableModule,
  MODULE_OPTIONS_TOKEN: SQL_QUEUE_PROMETHEUS_OPTIONS,
} = new ConfigurableModuleBuilder<SqlQueuePrometheusOptions>({ moduleName: 'SqlQueuePrometheus' })
  .setClassMethodName('forRoot')
  .build();
