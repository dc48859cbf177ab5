import { afterAll, it } from 'vitest';
import { systemClock } from '../../lib/src/core/clock.js';
import { SqlQueueConsumer } from '../../lib/src/core/consumer/consumer.js';
import { silentLogger } from '../../lib/src/core/logger.js';
import { resolveConsumerOptions, resolveQueueOptions } from '../../lib/src/core/options.js';
import { QueueProducerCore } from '../../lib/src/core/producer/producer.js';
import { RemoteWaker, WakeBus } from '../../lib/src/core/wake.js';
import { createPostgresStore } from '../../lib/src/store/postgres/postgres.connect.js';
import { dropPgSchema, PG_URL, uniqueSchema } from '../helpers/databases.js';
import { waitFor } from '../helpers/wait-for.js';

const schema = uniqueSchema('wakeups');
afterAll(() => dropPgSchema(schema));

it('a producer on other connections wakes an idle consumer through LISTEN/NOTIFY, long before its next poll', async () => {
  // Consumer and producer share nothing but the database, as two processes would.
  const consumerStore = createPostgresStore({ url: PG_URL, poolSize: 3 }, { schema });
  const producerStore = createPostgresStore({ url: PG_URL, poolSize: 3 }, { schema });
  await consumerStore.migrate('auto');
  let handled = 0;
  let emptyClaims = 0;
  const consumerOptions = resolveConsumerOptions({});
  const consumer = new SqlQueueConsumer({
    store: consumerStore,
    clock: systemClock,
    logger: silentLogger,
    listeners: [{ emptyClaim: () => emptyClaims++ }],
    wakeBus: new WakeBus(),
    workerId: 'listener',
  });
  // Polling alone would find a job only after up to 20 s.
  consumer.register(
    resolveQueueOptions(
      'woken',
      { handler: { minReaders: 1, maxReaders: 1, minPollMs: 20_000, maxPollMs: 20_000 } },
      consumerOptions,
    ),
    async () => void handled++,
  );
  const waker = new RemoteWaker(producerStore, 5, silentLogger);
  const producer = new QueueProducerCore(
    producerStore,
    { maxPayloadBytes: 1024, maxAttemptsFor: () => 3 },
    new WakeBus(),
    waker,
  );
  try {
    await consumer.start();
    // The reader's first claim comes back empty and starts its long pause.
    await waitFor(
      () => emptyClaims,
      (n) => n >= 1,
      { what: 'the first empty claim' },
    );
    for (let round = 0; round < 3; round++) {
      await producer.enqueue('woken', { round });
      // A quarter of the 20 s pause: only a wake-up can run the job in time.
      await waitFor(
        () => handled,
        (n) => n > round,
        { timeoutMs: 5_000, what: `job ${round} to run` },
      );
    }
  } finally {
    waker.close();
    await consumer.stop(1_000);
    await Promise.all([consumerStore.close(), producerStore.close()]);
  }
});
