import { describe, expect, it, vi } from 'vitest';
import { resolveBrokerOptions } from '../../lib/src/broker/broker.options.js';
import {
  BROKER_CLOSE_TIMEOUT_MS,
  BrokerRuntime,
  checkBrokerSetup,
  type BrokerRuntimeDeps,
} from '../../lib/src/broker/broker.runtime.js';
import { endClosedConversation } from '../../lib/src/broker/reader/broker.receiver.queries.js';
import { brokerObservationQuery, brokerSetupBatches } from '../../lib/src/broker/setup/broker.setup.js';
import type { BrokerRow, ResolvedBrokerOptions } from '../../lib/src/broker/broker.types.js';
import { SqlQueueConfigError } from '../../lib/src/core/errors.js';
import { silentLogger, type QueueLogger } from '../../lib/src/core/logger.js';
import type { MssqlQueueStore } from '../../lib/src/store/mssql/mssql.store.js';
import { healthyBrokerObservationRows } from '../helpers/broker-observation.js';
import { BrokerDriverDouble } from '../helpers/broker-driver-double.js';
import { deadJobRecord } from '../helpers/job-records.js';

const resolve = (setup: 'auto' | 'print' | 'off'): ResolvedBrokerOptions =>
  resolveBrokerOptions({ queues: { orders: {}, invoices: { format: 'xml' } }, setup }, 'sqlqueue', [])!;

function recordingLogger(): QueueLogger & { lines: string[] } {
  const lines: string[] = [];
  return {
    lines,
    log: (m) => lines.push(`log ${m}`),
    warn: (m) => lines.push(`warn ${m}`),
    error: (m) => lines.push(`error ${m}`),
  };
}

/** Observation rows in turn: each observation of the boot check takes the next set. */
function observing(driver: BrokerDriverDouble, options: ResolvedBrokerOptions, ...answers: BrokerRow[][]): void {
  for (const rows of answers) driver.once(brokerObservationQuery(options).text, () => rows);
}

describe('the Service Broker boot check', () => {
  it('runs no DDL when every object is there', async () => {
    const options = resolve('auto');
    const driver = new BrokerDriverDouble();
    observing(driver, options, healthyBrokerObservationRows(options));
    await checkBrokerSetup(driver, options, silentLogger);
    expect(driver.statements()).toEqual([brokerObservationQuery(options).text]);
  });

  it("with setup 'auto', creates what is missing under the setup lock, then observes again", async () => {
    const options = resolve('auto');
    const driver = new BrokerDriverDouble();
    const missingQueue = healthyBrokerObservationRows(options).filter(
      (row) => !(row.Kind === 'queue' && row.Name === options.queues[0]!.queue.name),
    );
    observing(driver, options, missingQueue, healthyBrokerObservationRows(options));
    const logger = recordingLogger();
    await checkBrokerSetup(driver, options, logger);
    const shared = driver.statements('shared');
    // The lock first, then every setup batch, in one transaction that commits.
    expect(shared.slice(1)).toEqual(brokerSetupBatches(options));
    expect(driver.statements('autocommit').filter((t) => t === brokerObservationQuery(options).text)).toHaveLength(2);
    expect(driver.calls.some((c) => c.kind === 'commit' && c.session === 'shared')).toBe(true);
    expect(logger.lines.some((l) => l.startsWith('log Service Broker objects of 2 broker queue(s) set up'))).toBe(true);
    driver.assertDiscipline({ allEnded: true });
  });

  it('logs a warning setup does not cure once, though both observations see it', async () => {
    const options = resolve('auto');
    const driver = new BrokerDriverDouble();
    const poisonOn = (rows: BrokerRow[]) =>
      rows.map((row) =>
        row.Kind === 'queue' && row.Name === options.queues[1]!.queue.name ? { ...row, PoisonHandling: true } : row,
      );
    const healthy = poisonOn(healthyBrokerObservationRows(options));
    const missingQueue = healthy.filter((row) => !(row.Kind === 'queue' && row.Name === options.queues[0]!.queue.name));
    observing(driver, options, missingQueue, healthy);
    const logger = recordingLogger();
    await checkBrokerSetup(driver, options, logger);
    expect(driver.statements('autocommit').filter((t) => t === brokerObservationQuery(options).text)).toHaveLength(2);
    expect(logger.lines.filter((l) => l.startsWith('warn') && l.includes('POISON_MESSAGE_HANDLING'))).toHaveLength(1);
  });

  it('fails when the setup ran and objects are still missing, instead of looping', async () => {
    const options = resolve('auto');
    const driver = new BrokerDriverDouble();
    const missing = healthyBrokerObservationRows(options).filter((row) => row.Kind !== 'contract');
    observing(driver, options, missing, missing);
    await expect(checkBrokerSetup(driver, options, silentLogger)).rejects.toThrow(
      /Service Broker setup did not complete.*missing/,
    );
  });

  it("with setup 'print', runs no DDL, logs the script and fails naming the fix", async () => {
    const options = resolve('print');
    const driver = new BrokerDriverDouble();
    observing(driver, options, []);
    const logger = recordingLogger();
    const failure = checkBrokerSetup(driver, options, logger);
    await expect(failure).rejects.toBeInstanceOf(SqlQueueConfigError);
    await expect(failure).rejects.toThrow(/broker.setup is 'print'/);
    expect(driver.statements('shared')).toEqual([]);
    expect(
      logger.lines.some((l) => l.startsWith('error Service Broker setup script') && l.includes('CREATE QUEUE')),
    ).toBe(true);
  });

  it('fails naming ENABLE_BROKER when the broker is off, even with setup auto (enableBroker not set)', async () => {
    const options = resolve('auto');
    const driver = new BrokerDriverDouble();
    const rows = healthyBrokerObservationRows(options).map((row) =>
      row.Kind === 'database' ? { ...row, BrokerEnabled: false } : row,
    );
    observing(driver, options, rows);
    await expect(checkBrokerSetup(driver, options, silentLogger)).rejects.toThrow(/ENABLE_BROKER/);
    expect(driver.statements('shared')).toEqual([]);
  });
});

/** What createBrokerRuntime passes a runtime; the store only answers listDead and stats. */
const deps = (options: ResolvedBrokerOptions, store: Partial<MssqlQueueStore> = {}): BrokerRuntimeDeps => ({
  store: store as MssqlQueueStore,
  options,
  logger: silentLogger,
  listeners: [],
  maxPayloadBytes: 1024,
  consume: true,
});

describe('the Service Broker runtime facade', () => {
  it('refuses a name that is not a declared broker queue, before any SQL', async () => {
    const options = resolve('auto');
    const driver = new BrokerDriverDouble();
    const runtime = new BrokerRuntime(driver, deps(options));
    expect(runtime.queue('orders')?.name).toBe('orders');
    expect(runtime.queue('emails')).toBeUndefined();
    expect(() => runtime.send('emails', { a: 1 })).toThrow(/'emails' is not a broker queue/);
    expect(() => runtime.register('emails', { maxAttempts: 5 })).toThrow(/'emails' is not a broker queue/);
    expect(() => runtime.jobHandler('emails', async () => undefined)).toThrow(/'emails' is not a broker queue/);
    expect(driver.calls).toEqual([]);
  });

  it('validates a body against maxPayloadBytes before any SQL', async () => {
    const options = resolve('auto');
    const driver = new BrokerDriverDouble();
    const runtime = new BrokerRuntime(driver, deps(options));
    await expect(runtime.send('orders', { text: 'x'.repeat(2_000) })).rejects.toThrow(/1024/);
    expect(driver.calls).toEqual([]);
  });

  it('reports every declared queue in its snapshot, consumed or not, and closes the reader pool once', async () => {
    const options = resolve('auto');
    const driver = new BrokerDriverDouble();
    const runtime = new BrokerRuntime(driver, deps(options));
    runtime.register('orders', { maxAttempts: 5 });
    const snapshot = runtime.snapshot();
    expect(snapshot.queues.map((q) => [q.queue, q.consumed])).toEqual([
      ['orders', true],
      ['invoices', false],
    ]);
    await runtime.close();
    await runtime.close();
    expect(driver.closed).toBe(true);
  });

  it('does not wait past its bound for a reader pool whose connections stay checked out (a handler ignoring its abort)', async () => {
    vi.useFakeTimers();
    try {
      const options = resolve('auto');
      const driver = new BrokerDriverDouble();
      // tarn's destroy() waits for every used connection: a stuck handler's never comes back.
      driver.close = () => new Promise<void>(() => undefined);
      const logger = recordingLogger();
      const runtime = new BrokerRuntime(driver, { ...deps(options), logger });
      let closed = false;
      const closing = runtime.close().then(() => (closed = true));
      await vi.advanceTimersByTimeAsync(BROKER_CLOSE_TIMEOUT_MS - 1);
      expect(closed).toBe(false);
      await vi.advanceTimersByTimeAsync(1);
      await closing;
      expect(closed).toBe(true);
      expect(logger.lines.some((line) => line.startsWith('warn') && line.includes('still busy'))).toBe(true);
    } finally {
      vi.useRealTimers();
    }
  });
});

describe('the Service Broker runtime: dead messages and the close handshake', () => {
  it("a Close message's job ends its conversation on the shared pool (already ended is fine), and never reaches the handler", async () => {
    const options = resolve('auto');
    const driver = new BrokerDriverDouble({ strict: true });
    driver.on(endClosedConversation(), () => []);
    const runtime = new BrokerRuntime(driver, deps(options));
    const handled: unknown[] = [];
    const job = runtime.jobHandler('orders', async (body) => void handled.push(body));
    const handle = '11111111-2222-3333-4444-555555555555';
    await job(
      {
        type: options.queues[0]!.closeMessageType,
        conversationHandle: handle,
        conversationGroupId: handle,
        sequence: '7',
      },
      { jobId: '1' } as never,
    );
    expect(handled).toEqual([]);
    expect(driver.statements('autocommit')).toEqual([endClosedConversation()]);
    expect(driver.paramsOf(endClosedConversation())).toEqual({ handle: { type: 'uniqueidentifier', value: handle } });
    expect(endClosedConversation()).toMatch(/IF ERROR_NUMBER\(\) NOT IN \(8426, 8427\) THROW;/);
  });

  it('lists dead messages from the dead jobs of its table queue, decoded, validating the page before any SQL', async () => {
    const options = resolve('auto');
    const listDead = vi.fn(async () => ({
      jobs: [
        deadJobRecord({
          id: '42',
          queue: 'orders',
          payload: {
            type: options.queues[0]!.messageType,
            conversationHandle: 'H',
            conversationGroupId: 'G',
            sequence: '3',
            text: JSON.stringify({ order: 7 }),
          },
          groupKey: 'G',
        }),
      ],
      nextAfterId: null,
    }));
    const runtime = new BrokerRuntime(new BrokerDriverDouble({ strict: true }), deps(options, { listDead }));
    await expect(runtime.listDeadMessages('orders', { limit: 10 })).resolves.toEqual({
      messages: [
        {
          id: '42',
          queue: 'orders',
          conversationHandle: 'H',
          conversationGroupId: 'G',
          messageSequenceNumber: '3',
          messageTypeName: options.queues[0]!.messageType,
          body: { order: 7 },
          attempts: 5,
          lastError: 'boom',
          deadAt: new Date(1),
          droppedBytes: null,
        },
      ],
      nextAfterId: null,
    });
    expect(listDead).toHaveBeenCalledWith('orders', { limit: 10, afterId: null });
    await expect(runtime.listDeadMessages('orders', { limit: 0 })).rejects.toThrow(/limit/);
    await expect(runtime.listDeadMessages('orders', { afterId: 'x' })).rejects.toThrow(/id/);
    expect(listDead).toHaveBeenCalledTimes(1);
  });
});
