import { describe, expect, it, vi } from 'vitest';
import type { BrokerRuntimeApi } from '../../lib/src/broker/broker.types.js';
import type { QueueStore } from '../../lib/src/core/queue-store.js';
import { resolveModuleOptions } from '../../lib/src/nest/sql-queue.options.js';
import { createSqlQueueRuntime } from '../../lib/src/nest/sql-queue.runtime.js';

// The boot path itself (createSqlQueueRuntime), not SqlQueueRuntime.useBroker alone: the broker
// it connects must be the one whose doorbell the producer's wake-ups ring.

const ring = vi.fn(async (_queue: string) => undefined);
const broker = { doorbell: { ring, listen: vi.fn() }, close: vi.fn(async () => undefined) };
const store = {
  dialect: 'mssql',
  schema: 'sqlqueue',
  migrate: vi.fn(async () => ({ current: 1 })),
  recordQueueSettings: vi.fn(async () => undefined),
  close: vi.fn(async () => undefined),
} as unknown as QueueStore;

vi.mock('../../lib/src/store/create-store.js', () => ({ createQueueStore: async () => store }));
vi.mock('../../lib/src/broker/broker.runtime.js', () => ({
  createBrokerRuntime: async () => broker as unknown as BrokerRuntimeApi,
}));

describe('booting with broker.doorbell on SQL Server', () => {
  it('connects the broker so that table-queue wake-ups ring its doorbell', async () => {
    const options = resolveModuleOptions({
      connection: { dialect: 'mssql', url: 'mssql://app:x@db.example/shop' },
      migrations: 'off',
      broker: { doorbell: true },
    });
    const runtime = await createSqlQueueRuntime(options, []);
    expect(runtime.broker).toBe(broker);
    runtime.producer.wake('emails');
    await vi.waitFor(() => expect(ring).toHaveBeenCalledWith('emails'));
    await runtime.close();
  });
});
