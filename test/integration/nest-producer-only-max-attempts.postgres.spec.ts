import { expect, it } from 'vitest';
import { QueueHandler, QueueProducer } from '../../lib/src/index.js';
import { queueAppSuite } from '../helpers/queue-app.js';

// Issue 9 (friction in a fresh app). Before the fix, a handler's maxAttempts reached only the
// producer in its own process: a job enqueued by an API process with `consumer.enabled: false`
// was stored with that process's default (25) while its handler said 5, so it retried 25 times.
// Consumers now record the maxAttempts they apply, and every enqueue without its own reads it.

const { boot } = queueAppSuite('prodonly');

@QueueHandler('orders.mail', { maxAttempts: 5 })
class MailHandler {
  async handle() {}
}

it("a job enqueued in a producer-only app gets the consumer app's handler maxAttempts", async () => {
  await boot({ providers: [MailHandler] });
  // The API process: no handler, consumer off, and an older guess in its own `queues` entry.
  const api = await boot({
    module: {
      consumer: { enabled: false },
      queues: { 'orders.mail': { maxAttempts: 3 }, 'orders.audit': { maxAttempts: 4 } },
    },
  });
  const producer = api.app.get(QueueProducer);
  const maxAttemptsOf = async (jobId: string) => (await producer.getJob(jobId))!.maxAttempts;

  expect(await maxAttemptsOf((await producer.enqueue('orders.mail', { to: 'a@example.com' })).jobId)).toBe(5);
  const bulk = await producer.enqueueMany('orders.mail', [{ payload: 1 }, { payload: 2, idempotencyKey: 'mail-2' }]);
  expect(await Promise.all(bulk.map((r) => maxAttemptsOf(r.jobId)))).toEqual([5, 5]);
  // The caller's own value still wins.
  expect(await maxAttemptsOf((await producer.enqueue('orders.mail', {}, { maxAttempts: 2 })).jobId)).toBe(2);
  // A queue no consumer recorded keeps this process's own resolution.
  expect(await maxAttemptsOf((await producer.enqueue('orders.audit', {})).jobId)).toBe(4);
});
