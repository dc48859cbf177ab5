import { describe, expect, it } from 'vitest';
import type { BrokerRuntimeApi, BrokerSnapshot } from '../../lib/src/broker/broker.types.js';
import type { QueueEventListener } from '../../lib/src/core/events.js';
import { safeEmit } from '../../lib/src/core/events.js';
import { resolveMetricsOptions } from '../../lib/src/core/queue-metrics.js';
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
        readers: 3,
        busyReaders: 1,
        minReaders: 1,
        maxReaders: 5,
        lastActivationAt: null,
        disabledSeen: false,
        notificationProblem: null,
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
    options: { metrics: resolveMetricsOptions({ cacheMs: 0 }), queues: {}, broker: broker.options },
    store: { queueHealth: async () => [] },
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
  it('reads messages waiting, dead messages, endpoints, readers and the event counts', async () => {
    const { metrics, exporter, listeners } = setup(async () => ({ messagesWaiting: 12, dead: 2 }));
    safeEmit(listeners, 'brokerHandled', { queue: 'orders', attempt: 1, durationMs: 5 });
    safeEmit(listeners, 'brokerFailed', { queue: 'orders', attempt: 1, dead: false, error: 'x' });
    safeEmit(listeners, 'brokerDeadLettered', { queue: 'orders', reason: 'crashes', count: 1 });
    safeEmit(listeners, 'brokerDeadLettered', { queue: 'orders', reason: 'conversation-ended', count: 3 });
    safeEmit(listeners, 'brokerActivated', { queue: 'orders', source: 'poll' });
    safeEmit(listeners, 'brokerNotificationLost', { queue: 'orders', problem: 'dropped', recreated: true });

    const reading = await metrics.readBroker();
    expect(reading).toMatchObject({
      ok: true,
      endpoints: { CONVERSING: 4, DISCONNECTED_INBOUND: 1 },
      queues: [
        {
          queue: 'orders',
          readers: 3,
          busyReaders: 1,
          handled: 1,
          failed: 1,
          database: { messagesWaiting: 12, dead: 2 },
        },
      ],
    });

    const text = parsePrometheusText(await exporter.metrics());
    const value = (name: string, labels: Record<string, string> = {}) => sampleValue(text, name, labels);
    expect(value('sqlqueue_broker_up')).toBe(1);
    expect(value('sqlqueue_broker_messages_waiting', { queue: 'orders' })).toBe(12);
    expect(value('sqlqueue_broker_dead_messages', { queue: 'orders' })).toBe(2);
    expect(value('sqlqueue_broker_readers', { queue: 'orders', state: 'busy' })).toBe(1);
    expect(value('sqlqueue_broker_readers', { queue: 'orders', state: 'idle' })).toBe(2);
    expect(value('sqlqueue_broker_conversation_endpoints', { state: 'DISCONNECTED_INBOUND' })).toBe(1);
    expect(value('sqlqueue_broker_messages_handled_total', { queue: 'orders' })).toBe(1);
    expect(value('sqlqueue_broker_messages_failed_total', { queue: 'orders' })).toBe(1);
    expect(value('sqlqueue_broker_poison_moves_total', { queue: 'orders', reason: 'crashes' })).toBe(1);
    expect(value('sqlqueue_broker_poison_moves_total', { queue: 'orders', reason: 'conversation-ended' })).toBe(3);
    expect(value('sqlqueue_broker_poison_moves_total', { queue: 'orders', reason: 'max-attempts' })).toBe(0);
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
      queues: [{ queue: 'orders', readers: 3, database: null }],
    });
    const text = parsePrometheusText(await exporter.metrics());
    expect(sampleValue(text, 'sqlqueue_broker_up', {})).toBe(0);
    expect(sampleValue(text, 'sqlqueue_broker_messages_waiting', { queue: 'orders' })).toBeUndefined();
    expect(sampleValue(text, 'sqlqueue_broker_readers', { queue: 'orders', state: 'busy' })).toBe(1);
    exporter.onApplicationShutdown();
  });
});
