import { HealthIndicatorService } from '@nestjs/terminus';
import { describe, expect, it } from 'vitest';
import type { BrokerHealthReading } from '../../lib/src/broker/broker.types.js';
import { SqlQueueConfigError } from '../../lib/src/core/errors.js';
import { emptyQueueHealth } from '../../lib/src/core/metrics/queue-metrics.js';
import type { QueueConsumerSnapshot } from '../../lib/src/core/consumer/queue-consumer.js';
import type { QueueStats } from '../../lib/src/core/types.js';
import { assertQueueName } from '../../lib/src/core/validation.js';
import { SqlQueueHealthIndicator } from '../../lib/src/health.js';
import { SqlQueueConsumerHost, SQL_QUEUE_RUNTIME } from '../../lib/src/index.js';

interface Fakes {
  ping?: (timeoutMs: number) => Promise<void>;
  stats?: (queue: string) => Promise<QueueStats>;
  enabled?: boolean;
  running?: boolean;
  queues?: QueueConsumerSnapshot[];
  /** The broker runtime's health(name); absent: no broker option. */
  brokerHealth?: (name: string) => Promise<BrokerHealthReading>;
}

const never = () => new Promise<never>(() => undefined);

function stats(overrides: Partial<QueueStats> = {}): QueueStats {
  return { ...emptyQueueHealth('emails'), ...overrides };
}

/** The indicator against stand-ins of the runtime and consumer host (no database, no Nest app). */
function indicator(fakes: Fakes = {}): SqlQueueHealthIndicator {
  const runtime = {
    store: { dialect: 'postgres', schema: 'sqlqueue', ping: fakes.ping ?? (async () => undefined) },
    broker: fakes.brokerHealth
      ? { queue: (name: string) => (name === 'orders' ? {} : undefined), health: fakes.brokerHealth }
      : null,
    producer: {
      stats: (queue: string) => {
        assertQueueName(queue);
        return (fakes.stats ?? (async () => stats()))(queue);
      },
    },
  };
  const host = {
    enabled: fakes.enabled ?? true,
    snapshot: () => ({ running: fakes.running ?? true, startedAt: 0, queues: fakes.queues ?? [] }),
  };
  const moduleRef = {
    get: (token: unknown) => (token === SQL_QUEUE_RUNTIME ? runtime : token === SqlQueueConsumerHost ? host : null),
  };
  const result = new SqlQueueHealthIndicator(new HealthIndicatorService(), moduleRef as never);
  result.onModuleInit();
  return result;
}

function reader(overrides: Partial<QueueConsumerSnapshot> = {}): QueueConsumerSnapshot {
  return {
    queue: 'emails',
    readers: 1,
    running: 0,
    buffered: 0,
    lastLoopAt: Date.now(),
    claimFailing: false,
    stopping: false,
    maxPollMs: 2_000,
    maxReaders: 5,
    ...overrides,
  };
}

describe('SqlQueueHealthIndicator.database (readiness)', () => {
  it('is up with the response time when the round trip answers', async () => {
    const result = await indicator().database('db');
    expect(result.db).toMatchObject({ status: 'up', dialect: 'postgres', schema: 'sqlqueue' });
    expect(result.db.responseTimeMs).toBeGreaterThanOrEqual(0);
  });

  it('is down, without throwing, when the round trip fails', async () => {
    const result = await indicator({ ping: () => Promise.reject(new Error('ECONNREFUSED')) }).database('db');
    expect(result.db).toMatchObject({ status: 'down', error: 'ECONNREFUSED' });
  });

  it('is down within its time bound when the round trip never answers, and shares one round trip', async () => {
    let pings = 0;
    const health = indicator({
      ping: () => {
        pings++;
        return never();
      },
    });
    const startedAt = Date.now();
    const [a, b] = await Promise.all([
      health.database('db', { timeoutMs: 50 }),
      health.database('db', { timeoutMs: 50 }),
    ]);
    expect(Date.now() - startedAt).toBeLessThan(1_000);
    expect(a.db).toMatchObject({ status: 'down', error: expect.stringMatching(/timed out after 50 ms/) });
    expect(b.db.status).toBe('down');
    expect(pings).toBe(1);
  });

  it('is down (not a throw) for an invalid timeout', async () => {
    expect((await indicator().database('db', { timeoutMs: 0 })).db).toMatchObject({
      status: 'down',
      error: expect.stringMatching(/timeoutMs/),
    });
  });
});

describe('SqlQueueHealthIndicator.consumer (liveness)', () => {
  it('is up while readers run, even when every claim fails (database down)', async () => {
    const result = await indicator({
      ping: () => Promise.reject(new Error('down')),
      queues: [reader({ claimFailing: true })],
    }).consumer('live');
    expect(result.live).toMatchObject({
      status: 'up',
      running: true,
      queues: { emails: { readers: 1, idleReaders: 1, claimFailing: true, stalledAfterMs: 60_000 } },
    });
  });

  it('is down with the reason when a queue is wedged', async () => {
    const result = await indicator({ queues: [reader({ lastLoopAt: Date.now() - 120_000 })] }).consumer('live');
    expect(result.live).toMatchObject({ status: 'down', reason: expect.stringMatching(/claim loop made no progress/) });
    const lenient = await indicator({ queues: [reader({ lastLoopAt: Date.now() - 120_000 })] }).consumer('live', {
      stalledAfterMs: 300_000,
    });
    expect(lenient.live.status).toBe('up');
    // A queue that idles long between polls gets a longer default limit: 3 × its maxPollMs.
    const slowPoller = await indicator({
      queues: [reader({ lastLoopAt: Date.now() - 120_000, maxPollMs: 60_000 })],
    }).consumer('live');
    expect(slowPoller.live).toMatchObject({ status: 'up', queues: { emails: { stalledAfterMs: 180_000 } } });
  });

  it('is down when the consumer is not running, and up when it is disabled on purpose', async () => {
    expect((await indicator({ running: false }).consumer('live')).live).toMatchObject({
      status: 'down',
      reason: 'the queue consumer is not running',
    });
    expect((await indicator({ enabled: false, running: false }).consumer('live')).live).toMatchObject({
      status: 'up',
      enabled: false,
    });
  });
});

describe('SqlQueueHealthIndicator.backlog', () => {
  it('is up under the thresholds and down with the thresholds exceeded', async () => {
    const limits = { queue: 'emails', maxOldestReadyAgeMs: 60_000, maxExpiredLeases: 0, maxDead: 10 };
    const fine = await indicator({ stats: async () => stats({ oldestReadyAgeMs: 60_000, dead: 10 }) }).backlog(
      'b',
      limits,
    );
    expect(fine.b).toMatchObject({ status: 'up', oldestReadyAgeMs: 60_000, dead: 10 });
    const behind = await indicator({
      stats: async () => stats({ oldestReadyAgeMs: 60_001, expiredLeases: 2, dead: 3 }),
    }).backlog('b', limits);
    expect(behind.b).toMatchObject({
      status: 'down',
      exceeded: ['oldestReadyAgeMs 60001 > 60000', 'expiredLeases 2 > 0'],
    });
  });

  it('holds no waiting figure against a paused queue: its ready jobs wait on purpose (expired leases and dead still count)', async () => {
    const limits = { queue: 'emails', maxOldestReadyAgeMs: 60_000, maxReady: 10, maxExpiredLeases: 0, maxDead: 10 };
    const waiting = { oldestReadyAgeMs: 3_600_000, ready: 5_000 };
    const paused = await indicator({ stats: async () => stats({ ...waiting, paused: true }) }).backlog('b', limits);
    expect(paused.b).toMatchObject({ status: 'up', paused: true, ready: 5_000 });
    const pausedAndLeaking = await indicator({
      stats: async () => stats({ ...waiting, paused: true, expiredLeases: 1, dead: 11 }),
    }).backlog('b', limits);
    expect(pausedAndLeaking.b).toMatchObject({ status: 'down', exceeded: ['expiredLeases 1 > 0', 'dead 11 > 10'] });
    const running = await indicator({ stats: async () => stats(waiting) }).backlog('b', limits);
    expect(running.b).toMatchObject({
      status: 'down',
      paused: false,
      exceeded: ['oldestReadyAgeMs 3600000 > 60000', 'ready 5000 > 10'],
    });
  });

  it('is down, without throwing, for an invalid queue name or statistics that never come', async () => {
    expect((await indicator().backlog('b', { queue: 'not a queue' })).b).toMatchObject({
      status: 'down',
      error: expect.stringMatching(/queue name/),
    });
    const startedAt = Date.now();
    const slow = await indicator({ stats: never }).backlog('b', { queue: 'emails', timeoutMs: 50 });
    expect(slow.b).toMatchObject({ status: 'down', error: expect.stringMatching(/timed out/) });
    expect(Date.now() - startedAt).toBeLessThan(1_000);
  });
});

it('fails the boot with a clear message when SqlQueueModule is missing', () => {
  const moduleRef = {
    get: () => {
      throw new Error('Nest could not find SQL_QUEUE_RUNTIME');
    },
  };
  const health = new SqlQueueHealthIndicator(new HealthIndicatorService(), moduleRef as never);
  expect(() => health.onModuleInit()).toThrow(SqlQueueConfigError);
  expect(() => health.onModuleInit()).toThrow(/needs SqlQueueModule/);
});

describe('SqlQueueHealthIndicator.broker()', () => {
  const healthy: BrokerHealthReading = { healthy: true, problems: [], details: { receiveEnabled: true } };

  it('is up with the details of a healthy broker queue', async () => {
    const result = await indicator({ brokerHealth: async () => healthy }).broker('sb', 'orders');
    expect(result).toEqual({ sb: { status: 'up', queue: 'orders', receiveEnabled: true } });
  });

  it('is down with the problems found', async () => {
    const reading: BrokerHealthReading = {
      healthy: false,
      problems: ['queue [sqlqueue].[orders_TargetQueue] is disabled'],
      details: { receiveEnabled: false },
    };
    const result = await indicator({ brokerHealth: async () => reading }).broker('sb', 'orders');
    expect(result.sb).toMatchObject({ status: 'down', receiveEnabled: false, problems: reading.problems });
  });

  it('is down, without waiting past its bound, when the reading hangs', async () => {
    const started = Date.now();
    const result = await indicator({ brokerHealth: never }).broker('sb', 'orders', { timeoutMs: 50 });
    expect(result.sb).toMatchObject({ status: 'down', queue: 'orders' });
    expect(String(result.sb.error)).toMatch(/Service Broker queue 'orders'/);
    expect(Date.now() - started).toBeLessThan(2_000);
  });

  it('is down naming the problem for a name that is not a broker queue, or without a broker option', async () => {
    expect((await indicator({ brokerHealth: async () => healthy }).broker('sb', 'emails')).sb).toMatchObject({
      status: 'down',
      error: "'emails' is not a broker queue declared under the broker option",
    });
    expect((await indicator().broker('sb', 'orders')).sb).toMatchObject({ status: 'down' });
  });
});
