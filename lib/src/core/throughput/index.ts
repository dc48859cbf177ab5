// Per-minute outcome counts (the dashboard's throughput chart), framework-free: the recorder
// each process runs, and the checks every store applies to what it is sent.
export { DEFAULT_THROUGHPUT_FLUSH_MS, ThroughputRecorder, type ThroughputRecorderDeps } from './throughput-recorder.js';
export { assertThroughputMinutes, sumThroughputByQueue, THROUGHPUT_MAX_MINUTES } from './throughput-counts.js';
