/**
 * The table queue's Service Broker doorbell (broker.doorbell, issue 12): on SQL Server, an
 * enqueue in one process wakes an idle reader in another at once, where it would otherwise wait
 * for its next poll; and rings do not pile up while no process listens.
 */
import { Injectable, Module } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ScheduleModule } from '@nestjs/schedule';
import { afterAll, expect, it } from 'vitest';
import { resolveBrokerOptions } from '../../../lib/src/broker/broker.options.js';
import { brokerTeardownBatches } from '../../../lib/src/broker/broker.setup.js';
import { QueueHandler, QueueProducer, SqlQueueModule, type SqlQueueModuleOptions } from '../../../lib/src/index.js';
import { messagesInQueue } from '../../helpers/broker-test-queries.js';
import { CaptureLogger } from '../../helpers/capture-logger.js';
import { uniqueSchema } from '../../helpers/databases.js';
import { dropMssqlSchema, mssqlRows, withMssqlPool } from '../../helpers/mssql.js';
import { waitFor } from '../../helpers/wait-for.js';
import { describeEachMssqlDatabase } from './mssql-databases.js';

describeEachMssqlDatabase(
  'Service Broker doorbell for table queues',
  (db) => {
    const schema = uniqueSchema('brkbell');
    const broker = resolveBrokerOptions({ doorbell: true }, schema)!;
    const apps: { close(): Promise<void> }[] = [];

    afterAll(async () => {
      await Promise.all(apps.map((app) => app.close().catch(() => undefined)));
      await withMssqlPool(db.url, async (pool) => {
        for (const batch of brokerTeardownBatches(broker)) await pool.request().batch(batch);
      });
      await dropMssqlSchema(db.url, schema);
    });

    const handled: { n: number; at: number }[] = [];

    @QueueHandler('emails')
    @Injectable()
    class EmailsHandler {
      async handle(payload: { n: number }): Promise<void> {
        handled.push({ n: payload.n, at: Date.now() });
      }
    }

    async function boot(consume: boolean) {
      const options: SqlQueueModuleOptions = {
        connection: { dialect: 'mssql', url: db.url, poolSize: 6 },
        schema,
        broker: { doorbell: true, waitTimeoutMs: 1_000 },
        // An idle reader polls every 20 s: only the doorbell can wake it sooner.
        consumer: { enabled: consume, minPollMs: 20_000, maxPollMs: 20_000 },
      };
      @Module({
        imports: [ScheduleModule.forRoot(), SqlQueueModule.forRoot(options)],
        providers: consume ? [EmailsHandler] : [],
      })
      class DoorbellTestModule {}
      const app = await NestFactory.createApplicationContext(DoorbellTestModule, {
        logger: new CaptureLogger(),
        abortOnError: false,
      });
      apps.push(app);
      return app;
    }

    it('an enqueue in a producer process wakes the idle reader of a consumer process at once', async () => {
      await boot(true);
      const producer = (await boot(false)).get(QueueProducer);
      // Let the consumer's first (empty) claim pass, so that its reader sleeps its 20 s poll.
      await new Promise((resolve) => setTimeout(resolve, 2_000));
      const sentAt = Date.now();
      await producer.enqueue('emails', { n: 1 });
      await waitFor(
        () => handled.find((h) => h.n === 1),
        (found) => found !== undefined,
        { timeoutMs: 15_000, what: 'the job to be handled' },
      );
      expect(handled.find((h) => h.n === 1)!.at - sentAt).toBeLessThan(5_000);
    });

    it('does not pile rings up while no process listens', async () => {
      // Nobody listens: the consumer of the first test is closed.
      await Promise.all(apps.splice(0).map((app) => app.close()));
      const producer = (await boot(false)).get(QueueProducer);
      for (let i = 0; i < 200; i++) await producer.enqueue('reports', { i });
      await new Promise((resolve) => setTimeout(resolve, 500));
      const [row] = await mssqlRows<{ Messages: number }>(db.url, messagesInQueue(broker.doorbell!.queue));
      // One waiting ring per table queue (a race may let a second one through); at least one, or
      // this would pass with a doorbell that never rings.
      expect(row!.Messages).toBeGreaterThanOrEqual(1);
      expect(row!.Messages).toBeLessThanOrEqual(2);
    });
  },
  (db) => !db.readCommittedSnapshot,
);
