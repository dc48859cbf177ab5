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
import { brokerTeardownBatches } from '../../../lib/src/broker/setup/broker.setup.js';
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
    /** Queues whose reader got an empty claim: it then sleeps its poll. */
    const idle = new Set<string>();

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
        listeners: [{ emptyClaim: ({ queue }) => idle.add(queue) }],
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
      // The consumer's first claim came back empty: its reader now sleeps its 20 s poll.
      await waitFor(
        () => idle.has('emails'),
        (yes) => yes,
        { timeoutMs: 15_000, what: "the consumer's first empty claim" },
      );
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
      const waiting = async () =>
        (await mssqlRows<{ Messages: number }>(db.url, messagesInQueue(broker.doorbell!.queue)))[0]!.Messages;
      // At least one ring (or this would pass with a doorbell that never rings)…
      const rings = await waitFor(waiting, (n) => n >= 1, {
        timeoutMs: 10_000,
        intervalMs: 100,
        what: 'a waiting ring',
      });
      // …and one waiting ring per table queue (a race may let a second one through), not 200.
      expect(rings).toBeLessThanOrEqual(2);
    });
  },
  (db) => !db.readCommittedSnapshot,
);
