import { describe, expect, it } from 'vitest';
import type { BrokerRuntimeApi, BrokerSnapshot } from '../../lib/src/broker/broker.types.js';
import type { QueueEventListener } from '../../lib/src/core/events.js';
import { safeEmit } from '../../lib/src/core/events.js';
import { resolveMetricsOptions } from '../../lib/src/core/metrics/queue-metrics.js';
import { resolveConsumerOptions } from '../../lib/src/core/options.js';
import { IDLE_SCALE_INPUTS } from '../helpers/scale.js';
import type { SqlQueueConsumerHost } from '../../lib/src/index.js';
import { SqlQueueMetrics } from '../../lib/src/index.js';
import type { SqlQueueRuntime } from '../../lib/src/nest/sql-queue.runtime.js';
import { SqlQueuePrometheusExporter } from '../../lib/src/prometheus.js';
import { parsePrometheusText, sampleValue } from '../helpers/prometheus-text.js';

/** A SqlQueueMetrics over a stand-in runtime whose broker answers fixed figures. */
function setup(brokerStats: () => Promise<{ messagesWaiting: number; dead: number }>) {
  const listeners: QueueEventListener[] = [];
  const snapshot: BrokerSnapshot = {
    running: true,
    listenerLastLoopAt: 0,
    queues: [
      {
        queue: 'orders',
        consumed: true,
        receivers: 3,
        busyReceivers: 1,
        minReceivers: 1,
        maxReceivers: 5,
        lastActivationAt: null,
        disabledSeen: false,
        notificationProblem: null,
        failingSince: null,
        lastError: null,
      },
    ],
  };
  const broker = {
    options: { queues: [{ name: 'orders' }] },
    snapshot: () => snapshot,
    stats: brokerStats,
    conversationEndpoints: async () => ({ CONVERSING: 4, DISCONNECTED_INBOUND: 1 }),
  } as unknown as BrokerRuntimeApi;
  const runtime = {
    options: {
      metrics: resolveMetricsOptions({ cacheMs: 0 }),
      queues: {},
      broker: broker.options,
      consumer: resolveConsumerOptions({}),
    },
    store: {
      queueHealth: async () => [],
      // The table queue itself is empty: the work is in the broker queue.
      scaleInputs: async () => IDLE_SCALE_INPUTS,
    },
    broker,
    addListener: (listener: QueueEventListener) => listeners.push(listener),
  } as unknown as SqlQueueRuntime;
  const host = { snapshot: () => ({ running: false, startedAt: null, queues: [] }) } as unknown as SqlQueueConsumerHost;
  const metrics = new SqlQueueMetrics(runtime, host);
  const exporter = new SqlQueuePrometheusExporter({}, { get: () => metrics } as never);
  exporter.onModuleInit();
  return { metrics, exporter, listeners };
}

describe('Service Broker figures in SqlQueueMetrics and Prometheus', () => {
  it("scales a broker queue on its messages waiting: they are its table queue's work", async () => {
    const { metrics, exporter } = setup(async () => ({ messagesWaiting: 600, dead: 0 }));
    const reading = await metrics.readScale();
    expect(reading.error).toBeNull();
    expect(reading.ok).toBe(true);
    // 600 waiting at the default 1 s a job, drained in 60 s: 10 readers, 2 pods of the default 5.
    expect(reading.queues).toEqual([
      expect.objectContaining({ queue: 'orders', brokerMessagesWaiting: 600, desiredReaders: 10, desiredWorkers: 2 }),
    ]);
    expect(reading.queues[0]!.inputs.claimable).toBe(600);
    const text = parsePrometheusText(await exporter.metrics());
    expect(sampleValue(text, 'sqlqueue_desired_workers', { queue: 'orders' })).toBe(2);
  });

  it('reads messages waiting, dead jobs, endpoints, receivers and the event counts', async () => {
    const { metrics, exporter, listeners } = setup(async () => ({ messagesWaiting: 12, dead: 2 }));
    safeEmit(listeners, 'brokerMoved', { queue: 'orders', received: 5, moved: 4, ended: 1 });
    safeEmit(listeners, 'brokerMoved', { queue: 'orders', received: 3, moved: 3, ended: 0 });
    safeEmit(listeners, 'brokerActivated', { queue: 'orders', source: 'poll' });
    safeEmit(listeners, 'brokerNotificationLost', { queue: 'orders', problem: 'dropped', recreated: true });

    const reading = await metrics.readBroker();
    expect(reading).toMatchObject({
      ok: true,
      endpoints: { CONVERSING: 4, DISCONNECTED_INBOUND: 1 },
      queues: [
        {
          queue: 'orders',
          receivers: 3,
          busyReceivers: 1,
          received: 8,
          moved: 7,
          ended: 1,
          database: { messagesWaiting: 12, dead: 2 },
        },
      ],
    });

    const text = parsePrometheusText(await exporter.metrics());
    const value = (name: string, labels: Record<string, string> = {}) => sampleValue(text, name, labels);
    expect(value('sqlqueue_broker_up')).toBe(1);
    expect(value('sqlqueue_broker_messages_waiting', { queue: 'orders' })).toBe(12);
    expect(value('sqlqueue_broker_receivers', { queue: 'orders', state: 'busy' })).toBe(1);
    expect(value('sqlqueue_broker_receivers', { queue: 'orders', state: 'idle' })).toBe(2);
    expect(value('sqlqueue_broker_conversation_endpoints', { state: 'DISCONNECTED_INBOUND' })).toBe(1);
    expect(value('sqlqueue_broker_messages_moved_total', { queue: 'orders' })).toBe(7);
    expect(value('sqlqueue_broker_conversations_ended_total', { queue: 'orders' })).toBe(1);
    // Handled, failed and dead messages are the table queue's figures now (sqlqueue_jobs_*).
    expect(
      [...text.keys()].filter((name) => /^sqlqueue_broker_(messages_handled|messages_failed|dead|poison)/.test(name)),
    ).toEqual([]);
    expect(value('sqlqueue_broker_activations_total', { queue: 'orders', source: 'poll' })).toBe(1);
    expect(value('sqlqueue_broker_notification_lost_total', { queue: 'orders' })).toBe(1);
    exporter.onApplicationShutdown();
  });

  it('a failed database reading keeps the process figures and reports broker_up 0, leaving the gauges out', async () => {
    const { metrics, exporter } = setup(async () => {
      throw new Error('login failed');
    });
    const reading = await metrics.readBroker();
    expect(reading).toMatchObject({
      ok: false,
      error: 'login failed',
      queues: [{ queue: 'orders', receivers: 3, database: null }],
    });
    const text = parsePrometheusText(await exporter.metrics());
    expect(sampleValue(text, 'sqlqueue_broker_up', {})).toBe(0);
    expect(sampleValue(text, 'sqlqueue_broker_messages_waiting', { queue: 'orders' })).toBeUndefined();
    expect(sampleValue(text, 'sqlqueue_broker_receivers', { queue: 'orders', state: 'busy' })).toBe(1);
    exporter.onApplicationShutdown();
  });
});
