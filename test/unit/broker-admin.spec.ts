import { describe, expect, it } from 'vitest';
import * as a from '../../lib/src/broker/broker.admin.queries.js';
import { BrokerAdmin } from '../../lib/src/broker/broker.admin.js';
import { resolveBrokerOptions } from '../../lib/src/broker/broker.options.js';
import { BrokerDriverDouble } from '../helpers/broker-driver-double.js';

const orders = resolveBrokerOptions({ queues: { orders: {} } }, 'sqlqueue')!.queues[0]!;

describe('BrokerAdmin', () => {
  it('reads the messages waiting from metadata (never the queue) and the endpoints by state', async () => {
    const driver = new BrokerDriverDouble({ strict: true });
    const admin = new BrokerAdmin(driver);
    driver.on(a.brokerQueueFigures(), () => [{ MessagesWaiting: '42' }]);
    driver.on(a.conversationEndpointsByState(), () => [
      { State: 'CONVERSING', Count: '10' },
      { State: 'CLOSED', Count: '2' },
    ]);
    await expect(admin.messagesWaiting(orders)).resolves.toBe(42);
    expect(driver.paramsOf(a.brokerQueueFigures()).queueObject).toEqual({
      type: 'nvarchar',
      value: '[sqlqueue].[orders_TargetQueue]',
    });
    await expect(admin.conversationEndpointsByState()).resolves.toEqual({ CONVERSING: 10, CLOSED: 2 });
    expect(a.brokerQueueFigures()).not.toMatch(/FROM \[sqlqueue\]\.\[orders_TargetQueue\]/);
    expect(driver.statements('autocommit')).toHaveLength(2);
  });
});
