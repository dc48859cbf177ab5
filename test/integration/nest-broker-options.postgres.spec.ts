import { Module, type Type } from '@nestjs/common';
import { afterAll, describe, expect, it } from 'vitest';
import { QueueHandler, QueueProducer, SqlQueueModule, type SqlQueueModuleOptions } from '../../lib/src/index.js';
import { dropPgSchema, PG_URL, uniqueSchema } from '../helpers/databases.js';
import { createQueueApp } from '../helpers/queue-app.js';

// The Service Broker option's boot checks that need no SQL Server (none runs here): they fail
// before the database is reached, or name the broker queue API on a PostgreSQL app.

const schema = uniqueSchema('nest_broker');
afterAll(() => dropPgSchema(schema));

/**
 * Boots against SQL Server on port 1, where nothing listens: a check that passes would fail
 * there with a connection error, never with the message a test expects.
 */
const bootMssql = (options: Partial<SqlQueueModuleOptions>, imports: Type[] = []) =>
  createQueueApp({
    schema,
    queueModule: SqlQueueModule.forRoot({
      connection: { dialect: 'mssql', url: 'mssql://sa:x@127.0.0.1:1/none' },
      schema,
      ...options,
    }),
    imports,
  });

describe('the broker option', () => {
  it('fails the boot on PostgreSQL, naming the fix', async () => {
    await expect(
      createQueueApp({
        schema,
        queueModule: SqlQueueModule.forRoot({
          connection: { dialect: 'postgres', url: PG_URL },
          schema,
          broker: { queues: { orders: {} } },
        }),
      }),
    ).rejects.toThrow(/Service Broker queues need SQL Server.*this connection is PostgreSQL/);
  });

  it('refuses a broker queue that is also a table queue', async () => {
    await expect(bootMssql({ queues: { orders: {} }, broker: { queues: { orders: {} } } })).rejects.toThrow(
      /broker.queues\['orders'\]: 'orders' is also a table queue/,
    );
  });

  it("checks the @QueueHandler options of a broker queue's handlers (table-queue options) before connecting", async () => {
    @QueueHandler('orders', { leaseMs: 60_000, minReaders: 3, maxReaders: 2 })
    class OrdersHandler {
      async handle() {}
    }
    @Module({ providers: [OrdersHandler] })
    class Handlers {}
    await expect(bootMssql({ broker: { queues: { orders: {} } } }, [Handlers])).rejects.toThrow(
      "@QueueHandler('orders') on OrdersHandler: minReaders (3) is greater than maxReaders (2)",
    );
    // Over broker.queues['orders'] (with the broker defaults), as a table queue's handler over its queues entry.
    @QueueHandler('orders', { maxReaders: 2 })
    class Narrower {
      async handle() {}
    }
    @Module({ providers: [Narrower] })
    class NarrowerHandlers {}
    await expect(bootMssql({ broker: { queues: { orders: { minReaders: 4 } } } }, [NarrowerHandlers])).rejects.toThrow(
      "@QueueHandler('orders') on Narrower: minReaders (4) is greater than maxReaders (2)",
    );
  });

  it('refuses requestTimeoutMs too close to waitTimeoutMs, before connecting', async () => {
    await expect(
      bootMssql({ broker: { queues: { orders: {} }, waitTimeoutMs: 5_000, requestTimeoutMs: 9_000 } }),
    ).rejects.toThrow(
      /broker.requestTimeoutMs \(9000\) must exceed broker.waitTimeoutMs \(5000\) by more than 5000 ms/,
    );
  });

  it('send() on an app without broker queues names the option, before any SQL', async () => {
    const { app } = await createQueueApp({ schema });
    try {
      const producer = app.get(QueueProducer);
      expect(() => producer.send('orders', { id: 1 })).toThrow(
        /'orders' is not a broker queue: declare Service Broker queues under the broker option/,
      );
      // Table queues keep their own dead-job API.
      await expect(producer.listDead('orders')).resolves.toEqual({ jobs: [], nextAfterId: null });
    } finally {
      await app.close();
    }
  });
});
