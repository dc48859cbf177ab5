import { Injectable, Module } from '@nestjs/common';
import { expect, it } from 'vitest';
import { QueueHandler, QueueProducer, SqlQueueConsumerHost } from '../../lib/src/index.js';
import { queueAppSuite } from '../helpers/queue-app.js';
import { deferred } from '../helpers/wait-for.js';

// Regression, found in review. Before the fix: a handler chosen at configuration time by subclass
// (`{ provide: EmailHandler, useClass: SmtpEmailHandler }`, the subclass inheriting @QueueHandler
// from its base) is silently not discovered: the explorer finds candidates through
// DiscoveryService's metadataKey index, which only links the exact class the decorator ran on,
// although getMetadataByDecorator (Reflect.getMetadata) does see the inherited metadata. The queue
// is not consumed, no warning, jobs wait forever.

const { boot } = queueAppSuite('disc');

it('consumes the queue of a @QueueHandler class provided through useClass with a subclass', async () => {
  const ran = deferred<string>();

  @QueueHandler('review.subclass')
  @Injectable()
  class EmailHandler {
    async handle(): Promise<void> {
      ran.resolve('base');
    }
  }
  class SmtpEmailHandler extends EmailHandler {
    override async handle(): Promise<void> {
      ran.resolve('smtp');
    }
  }
  @Module({ providers: [{ provide: EmailHandler, useClass: SmtpEmailHandler }] })
  class EmailsModule {}

  const { app } = await boot({ imports: [EmailsModule] });

  expect(app.get(EmailHandler)).toBeInstanceOf(SmtpEmailHandler);
  // Fails: the consumer has no reader for the queue, so the job below would never run.
  expect(
    app
      .get(SqlQueueConsumerHost)
      .snapshot()
      .queues.map((q) => q.queue),
  ).toContain('review.subclass');
  await app.get(QueueProducer).enqueue('review.subclass', {});
  expect(await ran.promise).toBe('smtp');
});
