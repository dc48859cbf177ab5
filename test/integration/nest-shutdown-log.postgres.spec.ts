import { expect, it } from 'vitest';
import { QueueHandler, QueueProducer, SqlQueueConsumerHost } from '../../lib/src/index.js';
import { queueAppSuite } from '../helpers/queue-app.js';
import { deferred, waitFor } from '../helpers/wait-for.js';

// Issue 9 (friction in a fresh app). Before the fix, the shutdown line read "1 running job(s)
// finished, 0 aborted after 8000 ms": the limit, printed where the time it took belongs, as if
// finishing had taken eight seconds.

const { boot, forget } = queueAppSuite('sdlog');

it('says how long stopping a queue took, apart from the limit it had', async () => {
  const release = deferred<void>();
  const started = deferred<void>();
  @QueueHandler('shutdown.log')
  class SlowHandler {
    async handle() {
      started.resolve();
      await release.promise;
    }
  }
  const { app, logger } = await boot({
    providers: [SlowHandler],
    module: { consumer: { shutdownTimeoutMs: 8_000 } },
  });
  await app.get(QueueProducer).enqueue('shutdown.log', {});
  await started.promise;

  const closeStartedAt = Date.now();
  const closing = app.close();
  forget(app);
  // Once the queue is stopping, the running handler is let finish.
  await waitFor(
    () =>
      app
        .get(SqlQueueConsumerHost)
        .snapshot()
        .queues.some((q) => q.stopping),
    Boolean,
    { what: 'the queue to start stopping' },
  );
  release.resolve();
  await closing;
  const closeTookMs = Date.now() - closeStartedAt;

  const [line] = logger.matching(/^queue 'shutdown\.log' stopped/);
  expect(line).toMatch(
    /^queue 'shutdown\.log' stopped in \d+ ms: 1 running job\(s\) finished, 0 aborted \(limit 8000 ms\), 0 prefetched job\(s\) given back$/,
  );
  const tookMs = Number(/stopped in (\d+) ms/.exec(line!)![1]);
  expect(tookMs).toBeLessThanOrEqual(closeTookMs);
  expect(tookMs).toBeLessThan(8_000);
});
