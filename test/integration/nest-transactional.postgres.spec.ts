import { Injectable } from '@nestjs/common';
import type pg from 'pg';
import { beforeAll, expect, it } from 'vitest';
import { QueueHandler, QueueProducer, SqlQueueConfigError, type JobContext } from '../../lib/src/index.js';
import { PG_URL, sql } from '../helpers/databases.js';
import { queueAppSuite } from '../helpers/queue-app.js';
import { waitFor } from '../helpers/wait-for.js';

// Transactional handlers from Nest (issue 25), as a user writes one: the handler writes through
// context.transaction and enqueues its follow-up with { transaction }; its first attempt throws
// after both, so they roll back, and the second commits them with the completion.

const { boot, schema } = queueAppSuite('nesttx');

beforeAll(async () => {
  await sql(PG_URL, `CREATE SCHEMA IF NOT EXISTS "${schema}"`);
  await sql(PG_URL, `CREATE TABLE "${schema}".invoices (order_id int NOT NULL, attempt int NOT NULL)`);
});

@Injectable()
@QueueHandler('invoices', { transactional: true, maxReaders: 2, backoff: { type: 'fixed', delayMs: 10 } })
class InvoiceHandler {
  constructor(private readonly producer: QueueProducer) {}

  async handle(payload: { orderId: number }, context: JobContext) {
    const client = context.transaction as pg.ClientBase;
    await client.query(`INSERT INTO "${schema}".invoices (order_id, attempt) VALUES ($1, $2)`, [
      payload.orderId,
      context.attempt,
    ]);
    await this.producer.enqueue('invoices.mail', { orderId: payload.orderId }, { transaction: context.transaction });
    if (context.attempt === 1) throw new Error('the first attempt fails after its writes');
    return { invoiced: payload.orderId };
  }
}

it('a transactional handler: a failed attempt leaves nothing, the next commits its writes with the completion', async () => {
  const { app } = await boot({ providers: [InvoiceHandler], module: { queues: { 'invoices.mail': {} } } });
  const producer = app.get(QueueProducer);
  const { jobId } = await producer.enqueue('invoices', { orderId: 7 });
  const done = await waitFor(
    () => producer.getJob(jobId),
    (job) => job?.state === 'done',
    { what: 'the invoice job to complete' },
  );
  expect(done).toMatchObject({ attempts: 2, result: { invoiced: 7 } });
  expect(await sql(PG_URL, `SELECT order_id, attempt FROM "${schema}".invoices`)).toEqual([
    { order_id: 7, attempt: 2 },
  ]);
  expect((await producer.stats('invoices.mail')).ready).toBe(1);
  expect((await producer.getAttempts(jobId)).map((a) => a.outcome)).toEqual(['failed', 'completed']);
});

@Injectable()
@QueueHandler('wide', { transactional: true, maxReaders: 6 })
class WideHandler {
  async handle() {}
}

it('refuses at boot a transactional queue that could hold every connection of the pool', async () => {
  await expect(boot({ providers: [WideHandler] })).rejects.toThrow(SqlQueueConfigError);
  await expect(boot({ providers: [WideHandler] })).rejects.toThrow(
    /queues with transactional: true \('wide'\) may run 6 handler\(s\) at once in this process \(their maxReaders\), each holding a connection until it commits, and the store's pool has 6: give the pool at least 8/,
  );
});
