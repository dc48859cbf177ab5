import { expect, it } from 'vitest';
import { QueueProducer, SqlQueueMetrics } from '../../lib/src/index.js';
import { PG_URL, sql } from '../helpers/databases.js';
import { queueAppSuite } from '../helpers/queue-app.js';

// The scale recommendation from Nest (issue 26): a producer-only app (no consumer anywhere) sees a
// queue's backlog as the readers and pods it needs, at the queue's configured maxReaders, and the
// same readers as the database function KEDA queries.

const { boot, schema } = queueAppSuite('nestscale');

it('SqlQueueMetrics.readScale: a backlog with no consumer recommends readers and pods; an idle queue 0', async () => {
  const { app } = await boot({
    module: { consumer: { enabled: false }, queues: { reports: { maxReaders: 4 }, idle: {} } },
  });
  const producer = app.get(QueueProducer);
  await producer.enqueueMany(
    'reports',
    Array.from({ length: 600 }, (_, i) => ({ payload: { i } })),
  );
  const reading = await app.get(SqlQueueMetrics).readScale();
  expect(reading.ok).toBe(true);
  const reports = reading.queues.find((q) => q.queue === 'reports')!;
  // 600 claimable at the default 1 s a job, drained in 60 s: 10 readers, 3 pods of 4.
  expect(reports).toMatchObject({ desiredReaders: 10, recommendedReaders: 10, maxReaders: 4, desiredWorkers: 3 });
  expect(reports.inputs).toMatchObject({ claimable: 600, running: 0, paused: false });
  expect(reading.queues.find((q) => q.queue === 'idle')).toMatchObject({ desiredReaders: 0, desiredWorkers: 0 });
  const [row] = await sql<{ n: number }>(PG_URL, `SELECT "${schema}".desired_readers('reports') AS n`);
  expect(row!.n).toBe(10);
});
