import { expect, it } from 'vitest';
import { QueueHandler, SqlQueueMetrics } from '../../lib/src/index.js';
import { SqlQueuePrometheusExporter, SqlQueuePrometheusModule } from '../../lib/src/prometheus.js';
import { parsePrometheusText } from '../helpers/prometheus-text.js';
import { queueAppSuite } from '../helpers/queue-app.js';

// Regression, found in review. Before the fix: with consumer.enabled: false (a producer-only
// deployment of the same code base, so the @QueueHandler classes are still there),
// SqlQueueConsumerHost keeps the never-started SqlQueueConsumer and snapshot() returns its queues.
// SqlQueueMetrics.processFigures() then reports reader state for queues this process does not
// consume (documented: null), and the Prometheus exporter publishes sqlqueue_readers 0 and a
// sqlqueue_claim_loop_idle_seconds that grows from boot forever -- an idle-loop alert fires on
// every producer-only pod.

const { boot } = queueAppSuite('mdis');

it('reports no reader state for queues a producer-only process does not consume', async () => {
  @QueueHandler('review.producer-only')
  class Handler {
    async handle() {}
  }
  const { app } = await boot({
    providers: [Handler],
    module: { consumer: { enabled: false } },
    imports: [SqlQueuePrometheusModule.forRoot({})],
  });

  const figures = app
    .get(SqlQueueMetrics)
    .processFigures()
    .find((p) => p.queue === 'review.producer-only');
  // Fails: { readers: 0, running: 0, ..., sinceLastLoopMs: <time since boot> }.
  expect.soft(figures?.consumer ?? null).toBeNull();

  const text = await app.get(SqlQueuePrometheusExporter).metrics();
  const families = parsePrometheusText(text);
  expect(families.get('sqlqueue_claim_loop_idle_seconds')?.samples ?? []).toEqual([]);
});
