import { Logger } from '@nestjs/common';
import { describe, expect, it, vi } from 'vitest';
import type { BrokerRuntimeApi } from '../../lib/src/broker/broker.types.js';
import type { QueueStore } from '../../lib/src/core/queue-store.js';
import { resolveModuleOptions } from '../../lib/src/nest/sql-queue.options.js';
import { SqlQueueRuntime } from '../../lib/src/nest/sql-queue.runtime.js';

// SQL Server has no NOTIFY: with broker.doorbell, the producer's cross-process wake-ups ring the
// Service Broker doorbell instead (the doorbell itself is tested in broker-doorbell.spec.ts).

const mssqlStore = { dialect: 'mssql', schema: 'sqlqueue' } as unknown as QueueStore;
const options = (doorbell: boolean, wakeups = true) =>
  resolveModuleOptions({
    connection: { dialect: 'mssql', url: 'mssql://app:x@db.example/shop' },
    broker: { queues: { orders: {} }, doorbell },
    wakeups: { enabled: wakeups },
  });
const brokerWith = (ring: (queue: string) => Promise<void>) =>
  ({ doorbell: { ring, listen: vi.fn() } }) as unknown as BrokerRuntimeApi;

describe('table-queue wake-ups on SQL Server', () => {
  it('ring the doorbell once the broker is connected', async () => {
    const runtime = new SqlQueueRuntime(options(true), mssqlStore, new Logger('test'));
    const ring = vi.fn(async () => undefined);
    runtime.useBroker(brokerWith(ring));
    runtime.producer.wake('emails');
    await vi.waitFor(() => expect(ring).toHaveBeenCalledWith('emails'));
    runtime.remoteWaker?.close();
  });

  it('send nothing without the doorbell, or with wake-ups off', () => {
    expect(new SqlQueueRuntime(options(false), mssqlStore, new Logger('test')).remoteWaker).toBeNull();
    expect(new SqlQueueRuntime(options(true, false), mssqlStore, new Logger('test')).remoteWaker).toBeNull();
  });
});
