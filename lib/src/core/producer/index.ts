// Enqueueing: the producer's core (single, bulk and batched enqueues, dead-job admin) and the
// validation that turns a caller's payload and options into a store-ready job.
export { MAX_DELAY_MS, prepareJob, SCHEDULE_KEY_PREFIX, withTraceContext } from './job-validation.js';
export {
  assertJobId,
  ENQUEUE_CHUNK,
  type EnqueueCallOptions,
  type EnqueueItem,
  QueueProducerCore,
} from './producer.js';
export { ASK_TTL_MS, FinishWatch, type FinishWatcher } from './finish-watch.js';
