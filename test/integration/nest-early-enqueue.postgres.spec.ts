import { Injectable, type OnModuleInit } from '@nestjs/common';
import { expect, it } from 'vitest';
import { QueueHandler, QueueProducer, type JobId } from '../../lib/src/index.js';
import { queueAppSuite } from '../helpers/queue-app.js';

// Regression, found in review. Before the fix: the handler's options reach the producer
// (runtime.handlerOptions, used for the maxAttempts stored with each job) only when
// SqlQueueConsumerHost.onApplicationBootstrap runs. An enqueue made earlier in the same application
// -- from an onModuleInit, or an onApplicationBootstrap of a module bootstrapped before
// SqlQueueModule -- stores the module or built-in default (25) instead of @QueueHandler's
// maxAttempts, and that job then retries 25 times although its handler says 7.

const { boot } = queueAppSuite('early');

it('stores the handler maxAttempts for a job enqueued during onModuleInit', async () => {
  @QueueHandler('review.early', { maxAttempts: 7 })
  class EarlyHandler {
    async handle() {}
  }
  @Injectable()
  class Seeder implements OnModuleInit {
    jobId: JobId | null = null;
    constructor(private readonly producer: QueueProducer) {}
    async onModuleInit() {
      this.jobId = (await this.producer.enqueue('review.early', { seed: true })).jobId;
    }
  }
  const { app } = await boot({
    providers: [EarlyHandler, Seeder],
    // Not consumed here, so the stored row can be read as enqueued.
    module: { consumer: { enabled: false } },
  });

  const producer = app.get(QueueProducer);
  const late = await producer.enqueue('review.early', { seed: false });
  expect((await producer.getJob(late.jobId))!.maxAttempts).toBe(7);
  // Fails: 25 (the default), because the handler options were not known yet.
  expect((await producer.getJob(app.get(Seeder).jobId!))!.maxAttempts).toBe(7);
});
