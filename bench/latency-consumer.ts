/** Child process of the latency benchmark: an idle consumer woken by LISTEN/NOTIFY. */
import type { QueueOptions } from '../lib/src/core/options.js';
import { createQueueStore } from '../lib/src/store/create-store.js';
import { consumerFor } from './common.js';
import { wallNow } from './cases/latency.js';

const { url, schema, queue, options } = JSON.parse(process.argv[2]!) as {
  url: string;
  schema: string;
  queue: string;
  options: QueueOptions;
};

const store = await createQueueStore({ dialect: 'postgres', url, poolSize: 6 }, { schema });
const consumer = consumerFor(
  store,
  [
    {
      queue,
      options,
      handler: async (payload) => {
        process.send?.({ type: 'started', latency: wallNow() - (payload as { sentAt: number }).sentAt });
      },
    },
  ],
  [],
);
await consumer.start();
process.send?.({ type: 'ready' });
process.on('SIGTERM', () => {
  void consumer
    .stop(2_000)
    .then(() => store.close())
    .then(() => process.exit(0));
});
