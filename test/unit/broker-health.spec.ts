import { describe, expect, it } from 'vitest';
import { BROKER_QUEUE_HOLD_MIN_MS, readBrokerHealth } from '../../lib/src/broker/broker.health.js';
import {
  readBrokerQueueHealth,
  readBrokerQueueLocks,
} from '../../lib/src/broker/activation/broker.listener.queries.js';
import { resolveBrokerOptions } from '../../lib/src/broker/broker.options.js';
import type { BrokerRow } from '../../lib/src/broker/broker.types.js';
import { BrokerDriverDouble, brokerError } from '../helpers/broker-driver-double.js';

const options = resolveBrokerOptions({ queues: { orders: {} }, waitTimeoutMs: 5_000 }, 'sqlqueue')!;
const healthy = { is_broker_enabled: true, is_receive_enabled: true, is_enqueue_enabled: true, activation_exists: 1 };

function reading(locks: BrokerRow | Error) {
  const driver = new BrokerDriverDouble({ strict: true })
    .on(readBrokerQueueHealth(), () => [healthy])
    .on(readBrokerQueueLocks(), () => {
      if (locks instanceof Error) throw locks;
      return [locks];
    });
  return { driver, health: readBrokerHealth(driver, options, 'orders', null) };
}

describe('broker health: who holds the queue and who waits for it (review 2, R2-4)', () => {
  it('is healthy while nobody waits for a schema lock and no transaction holds the queue for long', async () => {
    const { driver, health } = reading({ SchemaLockWaiters: 0, HolderSession: 61, HolderAgeMs: 4_000 });
    await expect(health).resolves.toMatchObject({
      healthy: true,
      problems: [],
      details: { locks: { readable: true, schemaLockWaiters: 0, holderSession: 61, holderAgeMs: 4_000 } },
    });
    expect(driver.paramsOf(readBrokerQueueLocks())).toEqual({
      queue: { type: 'nvarchar', value: '[sqlqueue].[orders_TargetQueue]' },
    });
  });

  it('reports a waiting schema-modification lock: every RECEIVE and SEND of the queue waits behind it', async () => {
    const { health } = reading({ SchemaLockWaiters: 1, HolderSession: 61, HolderAgeMs: 900 });
    const result = await health;
    expect(result.healthy).toBe(false);
    expect(result.problems).toEqual([
      "a schema-modification lock waits on queue [sqlqueue].[orders_TargetQueue], held by session 61, whose transaction began 900 ms ago (Service Broker's poison-message disable after five rolled-back receives, an ALTER QUEUE, or an event notification being changed): every RECEIVE, SEND and read of the queue waits behind it until that transaction ends",
    ]);
  });

  it('reports a transaction holding the queue past max(30 s, 3 × waitTimeoutMs)', async () => {
    expect(
      (await reading({ SchemaLockWaiters: 0, HolderSession: 7, HolderAgeMs: BROKER_QUEUE_HOLD_MIN_MS }).health).healthy,
    ).toBe(true);
    const result = await reading({ SchemaLockWaiters: 0, HolderSession: 7, HolderAgeMs: BROKER_QUEUE_HOLD_MIN_MS + 1 })
      .health;
    expect(result.healthy).toBe(false);
    expect(result.problems[0]).toMatch(
      /^queue \[sqlqueue\]\.\[orders_TargetQueue\] has been held by session 7, whose transaction began 30001 ms ago \(limit 30000 ms; a transaction left open after a RECEIVE\?\)/,
    );
  });

  it('without VIEW SERVER STATE it says so in the details and reports the rest', async () => {
    const { health } = reading(brokerError(300, "VIEW SERVER STATE permission was denied on object 'server'."));
    await expect(health).resolves.toMatchObject({
      healthy: true,
      details: {
        receiveEnabled: true,
        locks: {
          readable: false,
          reason: expect.stringMatching(/^VIEW SERVER STATE permission was denied.*needs VIEW SERVER STATE\)$/),
        },
      },
    });
  });
});
