// Public API of nestjs-sql-queue. Terminus health indicators live in 'nestjs-sql-queue/health',
// the Prometheus exporter in 'nestjs-sql-queue/prometheus': each pulls in its optional peer.
export { SqlQueueModule } from './nest/sql-queue.module.js';
export { SQL_QUEUE_MODULE_OPTIONS } from './nest/sql-queue.module-definition.js';
export type { SqlQueueModuleOptions } from './nest/sql-queue.options.js';
export { QueueProducer } from './nest/queue.producer.js';
export { QueueHandler, QueueHandlerMarker } from './nest/queue-handler.decorator.js';
export type {
  BrokerMessageHandler,
  QueueHandlerOptions,
  QueueJobHandler,
  QueueHandlerMetadata,
} from './nest/queue-handler.decorator.js';
export type {
  BrokerBodyFormat,
  BrokerDeadMessage,
  BrokerDeadMessagePage,
  BrokerMessageContext,
  BrokerOptions,
  BrokerQueueOptions,
  BrokerQueueStats,
  BrokerSent,
  BrokerSetupMode,
} from './broker/broker.types.js';
export { SqlQueueBrokerBodyError } from './broker/broker.body.js';
export { SqlQueueConsumerHost } from './nest/consumer.host.js';
export { SQL_QUEUE_RUNTIME } from './nest/sql-queue.tokens.js';
export type { SqlQueueRuntime } from './nest/sql-queue.runtime.js';
export { SqlQueueMetrics } from './nest/sql-queue.metrics.js';
export type {
  SqlQueueMetricsSnapshot,
  SqlQueueProcessFigures,
  SqlQueueQueueMetrics,
  SqlQueueReaderState,
  SqlQueueBrokerReading,
  SqlQueueScheduleReading,
  SqlQueueScheduleTicks,
  SqlQueueScaleFigures,
  SqlQueueScaleReading,
} from './nest/sql-queue.metrics.js';
export {
  DEFAULT_SCALE_POLICY,
  desiredReaders,
  desiredWorkers,
  ScaleRecommender,
  type ScaleInputs,
  type ScalePolicy,
} from './core/scaling/index.js';
export { DEFAULT_LATENCY_BUCKETS_SECONDS } from './core/metrics/index.js';
export { MAX_PROGRESS_BYTES, MAX_RESULT_BYTES } from './core/types.js';
export type {
  BrokerEventFigures,
  HistogramSnapshot,
  MetricsOptions,
  QueueEventFigures,
  QueueHealthReading,
} from './core/metrics/index.js';

export type { JobContext, JobHandler } from './core/consumer/index.js';
export type {
  ScheduleCatchUp,
  ScheduleDefinition,
  ScheduleJobOptions,
  ScheduleRecord,
  ScheduleSource,
  ScheduleTick,
} from './core/schedules/index.js';
export { SqlQueueSchedulerHost } from './nest/schedules.host.js';
export type { EnqueueCallOptions, EnqueueItem } from './core/producer/index.js';
export type { BackoffOption } from './core/backoff.js';
export type { QueueOptions, ConsumerOptions, ReaperOptions, RetentionOptions } from './core/options.js';
export type { QueueEventListener } from './core/events.js';
export type { ConsumerSnapshot } from './core/consumer/index.js';
export type { QueueConsumerSnapshot } from './core/consumer/index.js';
export type { QueueStore, Dialect, MigrationMode } from './core/queue-store.js';
export type { SqlQueueConnection } from './store/create-store.js';
export { mssqlConfigFromUrl } from './store/mssql/mssql.config.js';
export type { SqlQueueMssqlUrlConfig } from './store/mssql/mssql.config.js';
export type { SqlQueueMssqlConfig, SqlQueueMssqlPool, SqlQueuePgPool, SqlQueuePGlite } from './store/driver-shapes.js';
export type {
  AttemptRecord,
  BlockedGroup,
  BlockedGroupPage,
  CancelOutcome,
  CancelResult,
  DeadJobPage,
  EnqueueOptions,
  EnqueueResult,
  FlowKeyUsage,
  FlowLimits,
  FlowUsage,
  GroupOnDead,
  GroupRepair,
  JobId,
  JobRecord,
  JobState,
  ListedJobState,
  QueuePause,
  QueueStats,
  QueueHealth,
  QueueHealthRequest,
  RateLimit,
} from './core/types.js';
export {
  SqlQueueError,
  SqlQueueConfigError,
  SqlQueueValidationError,
  SqlQueueLeaseLostError,
  SqlQueueJobTimeoutError,
  SqlQueueCanceledError,
  SqlQueueRateLimitedError,
  SqlQueueWaitTimeoutError,
  SqlQueueShutdownError,
  SqlQueueUnrecoverableError,
  SqlQueueSchemaError,
  SqlQueueTransactionError,
  SqlQueueClosedError,
} from './core/errors.js';
