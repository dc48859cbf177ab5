import type { QueueStore } from '../../lib/src/core/queue-store.js';
import { prepareJob } from '../../lib/src/core/producer/job-validation.js';

/**
 * Records a queue's maxAttempts as a booting consumer does, enqueues a job without its own as a
 * producer does, and returns the maxAttempts the job was stored with.
 */
export async function maxAttemptsAfterRecording(
  store: QueueStore,
  queue: string,
  maxAttempts: number,
): Promise<number> {
  await store.recordQueueSettings([{ queue, maxAttempts }]);
  const [enqueued] = await store.enqueue([
    prepareJob(queue, {}, {}, { maxPayloadBytes: 1024, defaultMaxAttempts: 25 }),
  ]);
  return (await store.getJob(enqueued!.jobId))!.maxAttempts;
}
