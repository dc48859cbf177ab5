/** Child process of the idle benchmark: a consumer with N empty queues, counting its claims. */
import { createQueueStore } from '../lib/src/store/create-store.js';
import { consumerFor } from './common.js';

const { url, schema, queues, minPollMs, maxPollMs } = JSON.parse(process.argv[2]!) as {
  url: string;
  schema: string;
  queues: number;
  minPollMs: number;
  maxPollMs: number;
};

const store = await createQueueStore({ dialect: 'postgres', url, poolSize: 10 }, { schema });
let claims = 0;
const consumer = consumerFor(
  store,
  Array.from({ length: queues }, (_, i) => ({
    queue: `idle-${i}`,
    options: { minReaders: 1, maxReaders: 4, minPollMs, maxPollMs },
    handler: async () => {},
  })),
  [{ claimed: () => claims++, emptyClaim: () => claims++ }],
);
process.on('message', (message: { type: string; seconds: number }) => {
  if (message.type !== 'measure') return;
  const started = performance.now();
  void consumer.start().then(() =>
    setTimeout(() => {
      (globalThis as { gc?: () => void }).gc?.();
      process.send?.({
        type: 'report',
        rssBytes: process.memoryUsage().rss,
        claims,
        elapsedMs: performance.now() - started,
      });
    }, message.seconds * 1000),
  );
});
process.on('SIGTERM', () => {
  void consumer
    .stop(2_000)
    .then(() => store.close())
    .then(() => process.exit(0));
});
