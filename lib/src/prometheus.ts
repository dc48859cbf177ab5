// Entry point 'nestjs-sql-queue/prometheus': the prom-client exporter. Kept apart from the
// main entry point so that prom-client stays an optional peer.
export { SqlQueuePrometheusModule } from './nest/prometheus/sql-queue-prometheus.module.js';
export { SqlQueuePrometheusExporter } from './nest/prometheus/sql-queue-prometheus.exporter.js';
export { SQL_QUEUE_PROMETHEUS_OPTIONS } from './nest/prometheus/sql-queue-prometheus.options.js';
export type { SqlQueuePrometheusOptions } from './nest/prometheus/sql-queue-prometheus.options.js';
