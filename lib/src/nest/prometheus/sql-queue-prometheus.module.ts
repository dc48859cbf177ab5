import { Module } from '@nestjs/common';
import { SqlQueuePrometheusExporter } from './sql-queue-prometheus.exporter.js';
import { SqlQueuePrometheusConfigurableModule } from './sql-queue-prometheus.options.js';

/**
 * Prometheus exposition of the queue's measurements:
 * `SqlQueuePrometheusModule.forRoot({ registry? })` next to `SqlQueueModule.forRoot()`, then
 * serve `exporter.metrics()` with `exporter.contentType` from a `GET /metrics` handler.
 */
@Module({
  providers: [SqlQueuePrometheusExporter],
  exports: [SqlQueuePrometheusExporter],
})
export class SqlQueuePrometheusModule extends SqlQueuePrometheusConfigurableModule {}
