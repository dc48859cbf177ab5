import { Injectable } from '@nestjs/common';
import { expect, it } from 'vitest';
import { QueueHandler, QueueProducer, type JobContext } from '../../lib/src/index.js';
import { PG_URL, sql } from '../helpers/databases.js';
import { queueAppSuite } from '../helpers/queue-app.js';
import { waitFor } from '../helpers/wait-for.js';

// Enqueue from SQL reaching a Nest consumer (issue 25): a job the database function stored, in a
// transaction of its own, is handled by the app's @QueueHandler like any other; the wake-up it
// sends at commit brings an idle reader at once.

const { boot, schema } = queueAppSuite('nestsqlenq');

const handled: { payload: unknown; idempotencyKey: string | null; attempt: number }[] = [];

@Injectable()
@QueueHandler('orders.placed')
class OrderPlacedHandler {
  async handle(payload: unknown, context: JobContext) {
    handled.push({ payload, idempotencyKey: context.idempotencyKey, attempt: context.attempt });
    return { mailed: true };
  }
}

it('a Nest consumer handles the job <schema>.enqueue stored, as it handles the producer’s', async () => {
  const { app } = await boot({ providers: [OrderPlacedHandler] });
  const producer = app.get(QueueProducer);
  const [row] = await sql<{ job_id: string }>(
    PG_URL,
    `SELECT job_id::text AS job_id FROM "${schema}".enqueue('orders.placed', '{"orderId": 9}'::jsonb, idempotency_key => 'order:9')`,
  );
  const done = await waitFor(
    () => producer.getJob(row!.job_id),
    (job) => job?.state === 'done',
    { what: 'the job the SQL function enqueued to complete' },
  );
  expect(done).toMatchObject({ result: { mailed: true }, attempts: 1 });
  expect(handled).toEqual([{ payload: { orderId: 9 }, idempotencyKey: 'order:9', attempt: 1 }]);
  // The producer's enqueue with the same key is the same job, already done.
  expect(await producer.enqueue('orders.placed', { orderId: 9 }, { idempotencyKey: 'order:9' })).toEqual({
    jobId: row!.job_id,
    created: false,
  });
});
