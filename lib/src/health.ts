// Entry point 'nestjs-sql-queue/health': the Terminus indicators. Kept apart from the main
// entry point so that @nestjs/terminus stays an optional peer.
export { SqlQueueHealthModule } from './nest/health/sql-queue-health.module.js';
export { SqlQueueHealthIndicator, backlogViolations } from './nest/health/sql-queue-health.indicator.js';
export type {
  SqlQueueBacklogCheckOptions,
  SqlQueueBrokerCheckOptions,
  SqlQueueConsumerCheckOptions,
  SqlQueueDatabaseCheckOptions,
} from './nest/health/sql-queue-health.indicator.js';
export { assessConsumerLiveness, defaultStalledAfterMs, MIN_STALLED_AFTER_MS } from './core/consumer/index.js';
export type { ConsumerLiveness, QueueLiveness } from './core/consumer/index.js';
