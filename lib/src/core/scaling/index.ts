// How many readers and pods a queue needs (issue 26): one rule, framework-free, that the SQL
// functions for KEDA's scalers, the Prometheus gauge and SqlQueueMetrics share.
export {
  DEFAULT_SCALE_POLICY,
  desiredReaders,
  desiredWorkers,
  MAX_MEASURED_RUN_MS,
  resolveScalePolicy,
  SCALE_WINDOW_MINUTES,
  ScaleRecommender,
  type ResolvedScalePolicy,
  type ScaleInputs,
  type ScalePolicy,
} from './scale-recommendation.js';
