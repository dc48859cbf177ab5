// Measurements: event counters and histograms per queue, and the shared, bounded health reading.
export {
  BrokerEventCounts,
  type BrokerEventFigures,
  DEFAULT_LATENCY_BUCKETS_SECONDS,
  emptyQueueHealth,
  type HistogramSnapshot,
  type MetricsOptions,
  type QueueEventFigures,
  QueueEventMetrics,
  QueueHealthReader,
  type QueueHealthReading,
  type ResolvedMetricsOptions,
  resolveMetricsOptions,
  SharedReading,
} from './queue-metrics.js';
