// Running a queue's handlers: the consumer (readers, claim loop, leases, shutdown), the outcome
// recorder, the activation rule, the handler's contract and the liveness check.
export { readersToStart, shouldRetireAfterEmptyClaim } from './activation.js';
export {
  assessConsumerLiveness,
  type ConsumerLiveness,
  defaultStalledAfterMs,
  MIN_STALLED_AFTER_MS,
  type QueueLiveness,
} from './consumer-liveness.js';
export { type ConsumerSnapshot, defaultWorkerId, SqlQueueConsumer } from './consumer.js';
export { type JobContext, type JobHandler } from './handler.js';
export { type QueueConsumerSnapshot } from './queue-consumer.js';
