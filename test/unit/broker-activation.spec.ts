import { describe, expect, it } from 'vitest';
import type { QueueEventListener } from '../../lib/src/core/events.js';
import type { QueueLogger } from '../../lib/src/core/logger.js';
import { BrokerConsumer } from '../../lib/src/broker/activation/broker.consumer.js';
import { type BrokerActivationSource, type BrokerReaderLoop } from '../../lib/src/broker/broker.types.js';
import { readBrokerHealth } from '../../lib/src/broker/broker.health.js';
import { BrokerActivationListener, type BrokerListenerDeps } from '../../lib/src/broker/activation/broker.listener.js';
import {
  endBrokenNotificationDialog,
  pollBrokerQueue,
  readBrokerQueueHealth,
  receiveNotifications,
} from '../../lib/src/broker/activation/broker.listener.queries.js';
import { BROKER_SYSTEM } from '../../lib/src/broker/broker.names.js';
import { resolveBrokerOptions } from '../../lib/src/broker/broker.options.js';
import { brokerEventNotificationBatch } from '../../lib/src/broker/setup/broker.setup.js';
import type { BrokerRow, ResolvedBrokerOptions, ResolvedBrokerQueue } from '../../lib/src/broker/broker.types.js';
import { BrokerDriverDouble, brokerError } from '../helpers/broker-driver-double.js';
import { FakeClock, settle } from '../helpers/fake-clock.js';
import { DEFAULT_MAX_PAYLOAD_BYTES } from '../../lib/src/core/validation.js';

const WAIT_MS = 5_000;
const POLL_MS = 10_000;

function brokerOptions(
  queue: { minReceivers?: number; maxReceivers?: number } = {},
  extra: { setup?: 'auto' | 'print' | 'off' } = {},
): ResolvedBrokerOptions {
  return resolveBrokerOptions(
    {
      queues: { orders: { minReceivers: 1, maxReceivers: 4, ...queue } },
      waitTimeoutMs: WAIT_MS,
      pollIntervalMs: POLL_MS,
      ...extra,
    },
    'sqlqueue',
  )!;
}

class Logs implements QueueLogger {
  readonly lines: { level: string; message: string }[] = [];
  log = (message: string) => void this.lines.push({ level: 'log', message });
  warn = (message: string) => void this.lines.push({ level: 'warn', message });
  error = (message: string) => void this.lines.push({ level: 'error', message });
  debug = (message: string) => void this.lines.push({ level: 'debug', message });
  at(level: string): string[] {
    return this.lines.filter((l) => l.level === level).map((l) => l.message);
  }
}

/** Records every event the runtime emits, by name. */
function recorder(): { listener: QueueEventListener; events: { name: string; event: unknown }[] } {
  const events: { name: string; event: unknown }[] = [];
  const listener = new Proxy({} as QueueEventListener, {
    get: (_target, name) => (event: unknown) => void events.push({ name: String(name), event }),
  });
  return { listener, events };
}

/**
 * A Service Broker queue as readers see it: conversation groups with messages, each group
 * locked by at most one reader's transaction (seed 002), and readers that wait out
 * waitTimeoutMs when no unlocked group has messages (seed 003's "the second reader waits in
 * RECEIVE because every message belongs to one conversation").
 */
class QueueModel {
  readonly groups = new Map<string, { messages: number; lockedBy: FakeReader | null }>();
  busy = 0;
  maxBusy = 0;
  handled = 0;

  constructor(
    readonly clock: FakeClock,
    readonly handleMs = 100,
  ) {}

  add(group: string, messages: number): void {
    const g = this.groups.get(group) ?? { messages: 0, lockedBy: null };
    g.messages += messages;
    this.groups.set(group, g);
  }

  get remaining(): number {
    let n = 0;
    for (const g of this.groups.values()) n += g.messages;
    return n;
  }

  lockFor(reader: FakeReader): { messages: number; lockedBy: FakeReader | null } | null {
    for (const g of this.groups.values()) {
      if (g.messages > 0 && g.lockedBy === null) {
        g.lockedBy = reader;
        return g;
      }
    }
    return null;
  }
}

class FakeReader implements BrokerReaderLoop {
  busy = false;
  stopCalls = 0;
  runs = 0;
  private stopped = false;
  private idle: AbortController | null = null;

  constructor(
    private readonly model: QueueModel,
    private readonly script: (() => Promise<'empty' | 'handled' | 'stopped'> | null) | null = null,
  ) {}

  async runOnce(): Promise<'empty' | 'handled' | 'stopped'> {
    this.runs++;
    const scripted = this.script?.();
    if (scripted) return scripted;
    if (this.stopped) return 'stopped';
    const group = this.model.lockFor(this);
    if (!group) {
      // An idle WAITFOR: a stop cancels it (the reader then commits and reports 'stopped').
      this.idle = new AbortController();
      await this.model.clock.sleep(WAIT_MS, this.idle.signal);
      this.idle = null;
      return this.stopped ? 'stopped' : 'empty';
    }
    this.busy = true;
    this.model.busy++;
    this.model.maxBusy = Math.max(this.model.maxBusy, this.model.busy);
    try {
      await this.model.clock.sleep(this.model.handleMs); // the handler: drained at stop, not cancelled
      group.messages--;
      this.model.handled++;
    } finally {
      this.model.busy--;
      this.busy = false;
      group.lockedBy = null;
    }
    return 'handled';
  }

  stop(): void {
    this.stopCalls++;
    this.stopped = true;
    this.idle?.abort();
  }
}

/** A consumer of queue 'orders' with reader fakes and a stand-in listener the test drives. */
function consumerWith(
  options: ResolvedBrokerOptions,
  makeReader: (model: QueueModel) => FakeReader,
  model: QueueModel,
) {
  const clock = model.clock;
  const logs = new Logs();
  const { listener, events } = recorder();
  const readers: FakeReader[] = [];
  let listenerDeps: BrokerListenerDeps | null = null;
  let listenerStopped = false;
  const consumer = new BrokerConsumer({
    maxBodyBytes: DEFAULT_MAX_PAYLOAD_BYTES,
    driver: new BrokerDriverDouble(),
    options,
    clock,
    logger: logs,
    onMoved: () => undefined,
    listeners: [listener],
    random: () => 0.5,
    createReceiver: () => {
      const reader = makeReader(model);
      readers.push(reader);
      return reader;
    },
    createListener: (deps) => {
      listenerDeps = deps;
      return {
        start: () => undefined,
        stop: async () => void (listenerStopped = true),
        snapshot: () => ({ running: true, lastLoopAt: clock.now(), failing: false, queues: new Map() }),
      };
    },
  });
  consumer.register(options.queues[0]!, 5);
  const notify = (source: BrokerActivationSource = 'notification') => listenerDeps!.activate('orders', source);
  return { consumer, readers, logs, events, notify, listenerStopped: () => listenerStopped };
}

const readerCount = (consumer: BrokerConsumer) => consumer.snapshot().queues[0]!.receivers;

describe('broker activation: the reader pool of a queue (seed 003)', () => {
  it('a notification starts one reader', async () => {
    const model = new QueueModel(new FakeClock());
    const { consumer, events, notify } = consumerWith(brokerOptions(), (m) => new FakeReader(m), model);
    consumer.start();
    await settle();
    expect(readerCount(consumer)).toBe(1); // minReaders at boot
    notify();
    await settle();
    expect(readerCount(consumer)).toBe(2);
    expect(events.filter((e) => e.name === 'brokerActivated')).toEqual([
      { name: 'brokerActivated', event: { queue: 'orders', source: 'notification' } },
    ]);
    expect(events.filter((e) => e.name === 'brokerReceiversChanged').map((e) => e.event)).toEqual([
      { queue: 'orders', receivers: 1, reason: 'start' },
      { queue: 'orders', receivers: 2, reason: 'activation' },
    ]);
    expect(consumer.snapshot().queues[0]!.lastActivationAt).toBe(0);
    await consumer.stop(1_000);
  });

  it('repeated notifications never start more than maxReaders', async () => {
    const model = new QueueModel(new FakeClock());
    const { consumer, notify } = consumerWith(brokerOptions({ maxReceivers: 3 }), (m) => new FakeReader(m), model);
    consumer.start();
    for (let i = 0; i < 10; i++) notify();
    await settle();
    expect(readerCount(consumer)).toBe(3);
    await consumer.stop(1_000);
  });

  it('idle readers retire after an empty wait until minReaders run', async () => {
    const clock = new FakeClock();
    const model = new QueueModel(clock);
    const { consumer, notify, events } = consumerWith(
      brokerOptions({ minReceivers: 2, maxReceivers: 5 }),
      (m) => new FakeReader(m),
      model,
    );
    consumer.start();
    for (let i = 0; i < 5; i++) notify();
    await settle();
    expect(readerCount(consumer)).toBe(5);
    await clock.advance(WAIT_MS);
    expect(readerCount(consumer)).toBe(2);
    expect(events.filter((e) => (e.event as { reason?: string }).reason === 'retire')).toHaveLength(3);
    await clock.advance(WAIT_MS * 3); // the minimum keeps waiting
    expect(readerCount(consumer)).toBe(2);
    await consumer.stop(1_000);
  });

  it('1,000 messages in ONE conversation keep at most one busy reader, however often activation fires', async () => {
    const clock = new FakeClock();
    const model = new QueueModel(clock, 100);
    model.add('conversation-1', 1_000);
    const { consumer, notify } = consumerWith(
      brokerOptions({ minReceivers: 1, maxReceivers: 4 }),
      (m) => new FakeReader(m),
      model,
    );
    consumer.start();
    let maxReaders = 0;
    // A notification every second, as if the server kept asking; the extra readers find the
    // one group locked, wait, and retire.
    for (let second = 0; second < 120; second++) {
      notify();
      await clock.advance(1_000);
      maxReaders = Math.max(maxReaders, readerCount(consumer));
      expect(model.maxBusy).toBeLessThanOrEqual(1);
    }
    expect(model.handled).toBe(1_000);
    expect(maxReaders).toBeLessThanOrEqual(4);
    await clock.advance(WAIT_MS * 2);
    expect(readerCount(consumer)).toBe(1);
    expect(model.maxBusy).toBe(1);
    await consumer.stop(1_000);
  });

  it('(contrast) messages in four conversations keep up to four readers busy', async () => {
    const clock = new FakeClock();
    const model = new QueueModel(clock, 100);
    for (let g = 0; g < 4; g++) model.add(`conversation-${g}`, 50);
    const { consumer, notify } = consumerWith(
      brokerOptions({ minReceivers: 1, maxReceivers: 4 }),
      (m) => new FakeReader(m),
      model,
    );
    consumer.start();
    for (let i = 0; i < 3; i++) notify();
    await clock.advance(10_000);
    expect(model.maxBusy).toBe(4);
    expect(model.handled).toBe(200);
    await consumer.stop(1_000);
  });

  it('a reader whose runOnce rejects logs the queue name, backs off (growing, bounded), and continues', async () => {
    const clock = new FakeClock();
    const model = new QueueModel(clock);
    model.add('g', 1);
    const failAt: number[] = [];
    let failures = 0;
    const { consumer, logs, readers } = consumerWith(
      brokerOptions({ minReceivers: 1, maxReceivers: 1 }),
      (m) =>
        new FakeReader(m, () => {
          if (failures >= 4) return null;
          failures++;
          failAt.push(clock.now());
          return Promise.reject(brokerError(10054, 'connection reset'));
        }),
      model,
    );
    consumer.start();
    await clock.advance(1_000);
    // Failing since the first round, as the health reading is told (and the error).
    expect(consumer.snapshot().queues[0]).toMatchObject({ failingSince: 0, lastError: 'connection reset' });
    await clock.advance(19_000);
    expect(consumer.snapshot().queues[0]).toMatchObject({ failingSince: null, lastError: null });
    expect(failAt).toEqual([0, 281, 281 + 563, 281 + 563 + 1125]); // 250, 500, 1000 ms × (1 + 0.25 × 0.5 jitter)
    expect(model.handled).toBe(1); // the loop went on and handled the message
    expect(readers).toHaveLength(1);
    expect(readerCount(consumer)).toBe(1);
    expect(logs.at('error')[0]).toMatch(/reading broker queue 'orders' failed: connection reset; retrying in 281 ms/);
    expect(logs.at('log').some((m) => /reading broker queue 'orders' recovered/.test(m))).toBe(true);
    await consumer.stop(1_000);
  });

  it('a failing reader pauses at most 10 s between tries', async () => {
    const clock = new FakeClock();
    const model = new QueueModel(clock);
    const failAt: number[] = [];
    const { consumer } = consumerWith(
      brokerOptions({ minReceivers: 1, maxReceivers: 1 }),
      (m) =>
        new FakeReader(m, () => {
          failAt.push(clock.now());
          return Promise.reject(new Error('down'));
        }),
      model,
    );
    consumer.start();
    await clock.advance(120_000);
    const gaps = failAt.slice(1).map((t, i) => t - failAt[i]!);
    expect(Math.max(...gaps)).toBe(10_000);
    await consumer.stop(1_000);
  });

  it('stop during an idle WAITFOR stops the reader at once (the reader cancels and commits)', async () => {
    const clock = new FakeClock();
    const model = new QueueModel(clock);
    const { consumer, readers, events, listenerStopped } = consumerWith(
      brokerOptions(),
      (m) => new FakeReader(m),
      model,
    );
    consumer.start();
    await settle();
    const stopping = consumer.stop(30_000);
    await settle();
    await stopping; // no clock advance: the wait was cancelled, not waited out
    expect(listenerStopped()).toBe(true);
    expect(readers[0]!.stopCalls).toBe(1);
    expect(readerCount(consumer)).toBe(0);
    expect(events.at(-1)).toEqual({
      name: 'brokerReceiversChanged',
      event: { queue: 'orders', receivers: 0, reason: 'stop' },
    });
    expect(consumer.snapshot().running).toBe(false);
  });

  it('stop drains a busy reader: its handler finishes before stop resolves', async () => {
    const clock = new FakeClock();
    const model = new QueueModel(clock, 3_000);
    model.add('g', 5);
    const { consumer, readers } = consumerWith(
      brokerOptions({ minReceivers: 1, maxReceivers: 1 }),
      (m) => new FakeReader(m),
      model,
    );
    consumer.start();
    await clock.advance(1_000);
    expect(readers[0]!.busy).toBe(true);
    expect(consumer.snapshot().queues[0]!.busyReceivers).toBe(1);
    let stopped = false;
    const stopping = consumer.stop(10_000).then(() => (stopped = true));
    await clock.advance(1_000);
    expect(stopped).toBe(false);
    expect(readers[0]!.stopCalls).toBe(1);
    await clock.advance(1_000); // the handler ends at 3 s
    await stopping;
    expect(model.handled).toBe(1); // finished, and no further message was started
    expect(readers[0]!.runs).toBe(1);
  });

  it('activations after stop start nothing; register after start is refused', async () => {
    const model = new QueueModel(new FakeClock());
    const { consumer, notify } = consumerWith(brokerOptions(), (m) => new FakeReader(m), model);
    consumer.start();
    expect(() => consumer.register(brokerOptions().queues[0]!, 5)).toThrow(/before start/);
    await consumer.stop(1_000);
    notify();
    await settle();
    expect(readerCount(consumer)).toBe(0);
  });

  it('the snapshot lists every broker queue, consumed here or not', async () => {
    const options = resolveBrokerOptions({ queues: { orders: {}, mail: {} } }, 'sqlqueue')!;
    const consumer = new BrokerConsumer({
      maxBodyBytes: DEFAULT_MAX_PAYLOAD_BYTES,
      driver: new BrokerDriverDouble(),
      options,
      clock: new FakeClock(),
      logger: new Logs(),
      onMoved: () => undefined,
      listeners: [],
      createReceiver: () => new FakeReader(new QueueModel(new FakeClock())),
    });
    expect(consumer.snapshot()).toEqual({
      running: false,
      listenerLastLoopAt: null,
      queues: [
        expect.objectContaining({ queue: 'orders', consumed: false, receivers: 0, minReceivers: 1, maxReceivers: 2 }),
        expect.objectContaining({ queue: 'mail', consumed: false, receivers: 0 }),
      ],
    });
  });

  it('runs one initiator-queue reader per initiator queue, without activation', async () => {
    const clock = new FakeClock();
    const options = brokerOptions();
    const initiatorReaders: FakeReader[] = [];
    const consumer = new BrokerConsumer({
      maxBodyBytes: DEFAULT_MAX_PAYLOAD_BYTES,
      driver: new BrokerDriverDouble(),
      options,
      clock,
      logger: new Logs(),
      onMoved: () => undefined,
      listeners: [],
      createReceiver: () => new FakeReader(new QueueModel(clock)),
      createInitiatorReader: () => {
        const reader = new FakeReader(new QueueModel(clock));
        initiatorReaders.push(reader);
        return reader;
      },
    });
    consumer.registerInitiator(options.queues[0]!);
    consumer.registerInitiator(options.queues[0]!);
    consumer.start(); // nothing consumed: no listener either
    await clock.advance(WAIT_MS * 3);
    expect(initiatorReaders).toHaveLength(1);
    expect(initiatorReaders[0]!.runs).toBe(4); // 'empty' never retires the only reader
    await consumer.stop(1_000);
    expect(initiatorReaders[0]!.stopCalls).toBe(1);
  });
});

// ---- the activation listener, against the recorded driver double ---------------------------

interface ListenerRig {
  clock: FakeClock;
  double: BrokerDriverDouble;
  listener: BrokerActivationListener;
  logs: Logs;
  events: { name: string; event: unknown }[];
  activations: { queue: string; source: BrokerActivationSource }[];
  readers: { count: number };
  recreated: string[];
  recreateFails: { next: number };
  queue: ResolvedBrokerQueue;
  options: ResolvedBrokerOptions;
}

function listenerRig(options = brokerOptions()): ListenerRig {
  const clock = new FakeClock();
  const double = new BrokerDriverDouble();
  const logs = new Logs();
  const { listener: eventListener, events } = recorder();
  const activations: { queue: string; source: BrokerActivationSource }[] = [];
  const readers = { count: 1 };
  const recreated: string[] = [];
  const recreateFails = { next: 0 };
  // By default the notification queue is idle (the WAITFOR waits out its timeout) and the poll
  // finds everything in order.
  double.on(receiveNotifications(options.notificationQueue), () => clock.sleep(WAIT_MS).then(() => []));
  double.on(pollBrokerQueue(options.queues[0]!.queue), () => [pollRow()]);
  const listener = new BrokerActivationListener({
    driver: double,
    options,
    clock,
    logger: logs,
    listeners: [eventListener],
    random: () => 0.5,
    queues: options.queues,
    activate: (queue, source) => void activations.push({ queue, source }),
    readersOf: () => readers.count,
    recreateNotifications: async (queue) => {
      if (recreateFails.next > 0) {
        recreateFails.next--;
        throw brokerError(15151, 'Cannot alter the queue, because it does not exist or you do not have permission.');
      }
      recreated.push(queue.name);
    },
  });
  return {
    clock,
    double,
    listener,
    logs,
    events,
    activations,
    readers,
    recreated,
    recreateFails,
    queue: options.queues[0]!,
    options,
  };
}

function pollRow(row: Partial<Record<string, unknown>> = {}): BrokerRow {
  return { has_messages: 0, activation_exists: 1, disabled_exists: 1, is_receive_enabled: true, ...row };
}

function eventRow(
  eventType: string,
  object: { schema?: string; name?: string; thisDatabase?: number } = {},
): BrokerRow {
  return {
    conversation_handle: 'AAAAAAAA-0000-0000-0000-000000000001',
    message_type_name: BROKER_SYSTEM.EVENT_NOTIFICATION,
    event_type: eventType,
    schema_name: object.schema ?? 'sqlqueue',
    object_name: object.name ?? 'orders_TargetQueue',
    this_database: object.thisDatabase ?? 1,
  };
}

const receiveText = (rig: ListenerRig) => receiveNotifications(rig.options.notificationQueue);

describe('broker activation: the listener on the notification queue', () => {
  it('routes QUEUE_ACTIVATION of our queue to activate(…, notification) and commits each wait', async () => {
    const rig = listenerRig();
    rig.double.once(receiveText(rig), () => [
      eventRow('QUEUE_ACTIVATION'),
      eventRow('QUEUE_ACTIVATION', { name: 'ORDERS_TARGETQUEUE' }), // case-insensitive, as SQL Server names
      eventRow('QUEUE_ACTIVATION', { thisDatabase: 0 }), // another database's queue of the same name
      eventRow('QUEUE_ACTIVATION', { name: 'someone_elses_queue' }),
    ]);
    rig.listener.start();
    await settle();
    expect(rig.activations).toEqual([
      { queue: 'orders', source: 'notification' },
      { queue: 'orders', source: 'notification' },
    ]);
    const log = rig.double.log((t) => (t === receiveText(rig) ? 'RECEIVE' : t.startsWith('SELECT') ? 'POLL' : t));
    expect(log.filter((l) => l.startsWith('reader'))).toEqual([
      'reader#1 begin',
      'reader#1 RECEIVE',
      'reader#1 commit',
      'reader#2 begin',
      'reader#2 RECEIVE',
    ]);
    expect(rig.double.paramsOf(receiveText(rig))).toEqual({
      timeoutMs: { type: 'int', value: WAIT_MS },
      eventNotificationType: {
        type: 'nvarchar',
        value: 'http://schemas.microsoft.com/SQL/Notifications/EventNotification',
      },
    });
    await rig.listener.stop();
    rig.double.assertDiscipline({ allEnded: true });
  });

  it('the slow poll starts a reader for a queue with messages and no reader (a lost notification)', async () => {
    const rig = listenerRig();
    rig.readers.count = 0;
    rig.double.on(pollBrokerQueue(rig.queue.queue), () => [pollRow({ has_messages: 1 })]);
    rig.listener.start();
    await settle();
    expect(rig.activations).toEqual([{ queue: 'orders', source: 'poll' }]); // the poll at start
    rig.readers.count = 1; // now a reader runs: the next polls leave it alone
    await rig.clock.advance(POLL_MS * 3);
    expect(rig.activations).toHaveLength(1);
    rig.readers.count = 0;
    await rig.clock.advance(POLL_MS);
    expect(rig.activations).toHaveLength(2);
    expect(rig.double.paramsOf(pollBrokerQueue(rig.queue.queue))).toEqual({
      queue: { type: 'nvarchar', value: '[sqlqueue].[orders_TargetQueue]' },
      activationName: { type: 'nvarchar', value: rig.queue.activationNotification },
      disabledName: { type: 'nvarchar', value: rig.queue.disabledNotification },
    });
    await rig.listener.stop();
  });

  it('a missing event notification is recreated and reported, and the queue reads unhealthy until then', async () => {
    const rig = listenerRig();
    rig.recreateFails.next = 1;
    rig.double.once(pollBrokerQueue(rig.queue.queue), () => [pollRow({ activation_exists: 0 })]);
    rig.double.once(pollBrokerQueue(rig.queue.queue), () => [pollRow({ activation_exists: 0 })]);
    rig.listener.start();
    await settle();
    const problem = rig.listener.snapshot().queues.get('orders')!.notificationProblem;
    expect(problem).toMatch(
      /event notification sqlqueue_activation on queue \[sqlqueue\]\.\[orders_TargetQueue\] is missing/,
    );
    expect(rig.events.filter((e) => e.name === 'brokerNotificationLost').map((e) => e.event)).toEqual([
      { queue: 'orders', problem, recreated: false },
    ]);
    expect(rig.logs.at('error')[0]).toMatch(/recreating it failed: Cannot alter the queue.*ALTER permission/);

    await rig.clock.advance(POLL_MS); // the next poll recreates it
    expect(rig.recreated).toEqual(['orders']);
    expect(rig.listener.snapshot().queues.get('orders')!.notificationProblem).toBeNull();
    expect(rig.events.filter((e) => e.name === 'brokerNotificationLost').map((e) => e.event)).toEqual([
      { queue: 'orders', problem, recreated: false },
      { queue: 'orders', problem, recreated: true },
    ]);
    await rig.listener.stop();
  });

  it("with setup other than 'auto' a missing event notification is reported once with the fix, not recreated", async () => {
    const rig = listenerRig(brokerOptions({}, { setup: 'off' }));
    rig.double.on(pollBrokerQueue(rig.queue.queue), () => [pollRow({ disabled_exists: 0 })]);
    rig.listener.start();
    await rig.clock.advance(POLL_MS * 3);
    expect(rig.recreated).toEqual([]);
    expect(rig.events.filter((e) => e.name === 'brokerNotificationLost')).toHaveLength(1);
    expect(rig.logs.at('error')).toEqual([
      expect.stringMatching(/sqlqueue_disabled .* is missing.*broker.setup is 'off'.*setup script/),
    ]);
    expect(rig.listener.snapshot().queues.get('orders')!.notificationProblem).not.toBeNull();
    await rig.listener.stop();
  });

  it('an Error on the notification queue ends that dead dialog in the same transaction, then recreates the dropped event notification', async () => {
    const rig = listenerRig();
    rig.listener.start();
    await settle();
    const pollsBefore = rig.double.statements('autocommit').length;
    // The server broke the notification dialog and dropped its event notification.
    rig.double.once(receiveText(rig), () => [
      { conversation_handle: 'BBBBBBBB-0000-0000-0000-000000000002', message_type_name: BROKER_SYSTEM.ERROR },
      { conversation_handle: 'BBBBBBBB-0000-0000-0000-000000000002', message_type_name: BROKER_SYSTEM.END_DIALOG },
    ]);
    rig.double.once(pollBrokerQueue(rig.queue.queue), () => [pollRow({ activation_exists: 0 })]);
    await rig.clock.advance(WAIT_MS); // the idle wait ends; the next RECEIVE gets the Error
    const reader = rig.double
      .log((t) => (t === receiveText(rig) ? 'RECEIVE' : t))
      .filter((l) => l.startsWith('reader#2'));
    expect(reader).toEqual([
      'reader#2 begin',
      'reader#2 RECEIVE',
      `reader#2 ${endBrokenNotificationDialog()}`,
      'reader#2 commit',
    ]);
    expect(rig.double.paramsOf(endBrokenNotificationDialog())).toEqual({
      handle: { type: 'uniqueidentifier', value: 'BBBBBBBB-0000-0000-0000-000000000002' },
    });
    expect(rig.double.statements('autocommit').length).toBe(pollsBefore + 1); // checked at once, not at the next poll
    expect(rig.recreated).toEqual(['orders']);
    expect(rig.events.filter((e) => e.name === 'brokerNotificationLost')).toEqual([
      { name: 'brokerNotificationLost', event: expect.objectContaining({ queue: 'orders', recreated: true }) },
    ]);
    expect(rig.logs.at('warn')[0]).toMatch(/broken by the server/);
    await rig.listener.stop();
    rig.double.assertDiscipline({ allEnded: true });
  });

  it('stop during the idle WAITFOR cancels it and commits (never rolls back a RECEIVE)', async () => {
    const rig = listenerRig();
    const held = rig.double.hold(receiveText(rig));
    rig.listener.start();
    await held.reached;
    await rig.listener.stop(); // no clock advance: cancelled, not waited out
    expect(
      rig.double.log((t) => (t === receiveText(rig) ? 'RECEIVE' : t)).filter((l) => l.startsWith('reader')),
    ).toEqual(['reader#1 begin', 'reader#1 RECEIVE', 'reader#1 cancel', 'reader#1 commit']);
    rig.double.assertDiscipline({ allEnded: true });
    expect(rig.listener.snapshot().running).toBe(false);
  });

  it('BROKER_QUEUE_DISABLED marks the queue disabled (logged) until the poll sees it enabled again', async () => {
    const rig = listenerRig();
    rig.double.once(receiveText(rig), () => [eventRow('BROKER_QUEUE_DISABLED')]);
    rig.double.on(pollBrokerQueue(rig.queue.queue), () => [pollRow({ is_receive_enabled: false })]);
    rig.listener.start();
    await settle();
    expect(rig.listener.snapshot().queues.get('orders')!.disabledSeen).toBe(true);
    expect(rig.logs.at('error')).toEqual([
      expect.stringMatching(
        /disabled queue \[sqlqueue\]\.\[orders_TargetQueue\].*ALTER QUEUE \[sqlqueue\]\.\[orders_TargetQueue\] WITH STATUS = ON/,
      ),
    ]);
    expect(rig.activations).toEqual([]);
    await rig.clock.advance(POLL_MS); // still disabled: logged once
    expect(rig.logs.at('error')).toHaveLength(1);
    rig.double.on(pollBrokerQueue(rig.queue.queue), () => [pollRow({ is_receive_enabled: true })]);
    await rig.clock.advance(POLL_MS);
    expect(rig.listener.snapshot().queues.get('orders')!.disabledSeen).toBe(false);
    await rig.listener.stop();
  });

  it('a failing receive commits what it can, backs off, and its last loop time stops advancing', async () => {
    const rig = listenerRig();
    rig.double.on(receiveText(rig), () => {
      throw brokerError(9617, 'The service queue "BrokerActivationQueue" is currently disabled.');
    });
    rig.listener.start();
    await rig.clock.advance(30_000);
    const snapshot = rig.listener.snapshot();
    expect(snapshot.failing).toBe(true);
    expect(snapshot.lastLoopAt).toBe(0);
    expect(rig.double.calls.filter((c) => c.kind === 'rollback')).toEqual([]);
    expect(rig.logs.at('error')[0]).toMatch(
      /receiving activation events from sqlqueue.BrokerActivationQueue failed: The service queue/,
    );
    await rig.listener.stop();
    rig.double.assertDiscipline({ allEnded: true });
  });
});

// ---- health ----------------------------------------------------------------------------

describe('broker health reading', () => {
  const options = brokerOptions();
  function driverAnswering(row: BrokerRow | null): BrokerDriverDouble {
    return new BrokerDriverDouble({ strict: true }).on(readBrokerQueueHealth(), () => (row ? [row] : []));
  }
  const good = { is_broker_enabled: true, is_receive_enabled: true, is_enqueue_enabled: true, activation_exists: 1 };
  const snapshot = (
    over: {
      lastLoopAt?: number | null;
      problem?: string | null;
      running?: boolean;
      failingSince?: number | null;
    } = {},
  ) => ({
    running: over.running ?? true,
    listenerLastLoopAt: over.lastLoopAt === undefined ? 1_000 : over.lastLoopAt,
    queues: [
      {
        queue: 'orders',
        consumed: true,
        receivers: 2,
        busyReceivers: 1,
        minReceivers: 1,
        maxReceivers: 4,
        lastActivationAt: 900,
        disabledSeen: false,
        notificationProblem: over.problem ?? null,
        failingSince: over.failingSince ?? null,
        lastError: over.failingSince === undefined || over.failingSince === null ? null : 'Lock request time out',
      },
    ],
  });

  it('healthy: broker on, queue enabled, event notification present, listener alive', async () => {
    const driver = driverAnswering(good);
    const reading = await readBrokerHealth(driver, options, 'orders', snapshot(), 1_000 + 30_000);
    expect(reading).toEqual({
      healthy: true,
      problems: [],
      details: expect.objectContaining({ consumed: true, listenerAlive: true, receivers: 2, busyReceivers: 1 }),
    });
    expect(driver.paramsOf(readBrokerQueueHealth())).toEqual({
      queue: { type: 'nvarchar', value: '[sqlqueue].[orders_TargetQueue]' },
      activationName: { type: 'nvarchar', value: options.queues[0]!.activationNotification },
    });
  });

  it('names each problem with its fix', async () => {
    const reading = await readBrokerHealth(
      driverAnswering({
        is_broker_enabled: false,
        is_receive_enabled: false,
        is_enqueue_enabled: true,
        activation_exists: 0,
      }),
      options,
      'orders',
      snapshot(),
      1_000,
    );
    expect(reading.healthy).toBe(false);
    expect(reading.problems).toEqual([
      expect.stringMatching(/is_broker_enabled = 0.*ENABLE_BROKER/),
      expect.stringMatching(
        /is_receive_enabled = 0.*ALTER QUEUE \[sqlqueue\]\.\[orders_TargetQueue\] WITH STATUS = ON/,
      ),
      expect.stringMatching(/event notification sqlqueue_activation .* is missing/),
    ]);
  });

  it('the listener counts as dead past 2 × (waitTimeoutMs + pollIntervalMs) without progress', async () => {
    const limit = 2 * (WAIT_MS + POLL_MS);
    const alive = await readBrokerHealth(driverAnswering(good), options, 'orders', snapshot(), 1_000 + limit);
    expect(alive.healthy).toBe(true);
    const dead = await readBrokerHealth(driverAnswering(good), options, 'orders', snapshot(), 1_000 + limit + 1);
    expect(dead.problems).toEqual([
      `the activation listener made no progress for ${limit + 1} ms (limit ${limit} ms): the notification queue cannot be read`,
    ]);
  });

  it('receivers that failed every round past max(30 s, 3 × waitTimeoutMs) read unhealthy, naming the last error', async () => {
    const bound = Math.max(30_000, 3 * WAIT_MS);
    const at = (since: number, now: number) =>
      readBrokerHealth(
        driverAnswering(good),
        options,
        'orders',
        snapshot({ failingSince: since, lastLoopAt: now }),
        now,
      );
    expect((await at(1_000, 1_000 + bound)).healthy).toBe(true);
    const failing = await at(1_000, 1_000 + bound + 1);
    expect(failing.problems).toEqual([
      `the receivers of broker queue 'orders' have failed every round for ${bound + 1} ms (limit ${bound} ms; last error: Lock request time out): its messages are not reaching the handlers`,
    ]);
    expect(failing.details).toMatchObject({ receiversFailingSince: 1_000 });
  });

  it('a pending event notification problem, a missing queue, or an unknown name read unhealthy', async () => {
    const pending = await readBrokerHealth(
      driverAnswering(good),
      options,
      'orders',
      snapshot({ problem: 'event notification sqlqueue_disabled … is missing' }),
      1_000,
    );
    expect(pending.problems).toEqual(['event notification sqlqueue_disabled … is missing']);
    const missing = await readBrokerHealth(
      driverAnswering({
        is_broker_enabled: true,
        is_receive_enabled: null,
        is_enqueue_enabled: null,
        activation_exists: 0,
      }),
      options,
      'orders',
      null,
    );
    expect(missing.problems).toEqual([
      expect.stringMatching(/queue \[sqlqueue\]\.\[orders_TargetQueue\] does not exist/),
    ]);
    const unknown = await readBrokerHealth(driverAnswering(good), options, 'nope', null);
    expect(unknown).toEqual({
      healthy: false,
      problems: ["'nope' is not a broker queue (declared under broker.queues: 'orders')"],
      details: {},
    });
  });

  it('a queue this process only sends to is judged on the database alone', async () => {
    const reading = await readBrokerHealth(
      driverAnswering(good),
      options,
      'orders',
      { running: true, listenerLastLoopAt: null, queues: [] },
      1e9,
    );
    expect(reading.healthy).toBe(true);
    expect(reading.details).toEqual(expect.objectContaining({ consumed: false }));
  });
});

describe('broker activation: the consumer with its real listener', () => {
  it('a notification starts a reader, a missing event notification is recreated with the setup batch', async () => {
    const clock = new FakeClock();
    const options = brokerOptions();
    const queue = options.queues[0]!;
    const double = new BrokerDriverDouble();
    double.on(receiveNotifications(options.notificationQueue), () => clock.sleep(WAIT_MS).then(() => []));
    double.once(receiveNotifications(options.notificationQueue), () => [eventRow('QUEUE_ACTIVATION')]);
    double.on(pollBrokerQueue(queue.queue), () => [pollRow()]);
    double.once(pollBrokerQueue(queue.queue), () => [pollRow({ activation_exists: 0 })]);
    const model = new QueueModel(clock);
    const { listener, events } = recorder();
    const consumer = new BrokerConsumer({
      maxBodyBytes: DEFAULT_MAX_PAYLOAD_BYTES,
      driver: double,
      options,
      clock,
      logger: new Logs(),
      onMoved: () => undefined,
      listeners: [listener],
      createReceiver: () => new FakeReader(model),
    });
    consumer.register(queue, 5);
    consumer.start();
    await settle();
    expect(readerCount(consumer)).toBe(2); // minReaders + the notification
    expect(double.statements('autocommit')).toContain(brokerEventNotificationBatch(queue, options));
    expect(events.filter((e) => e.name === 'brokerNotificationLost')).toEqual([
      { name: 'brokerNotificationLost', event: expect.objectContaining({ queue: 'orders', recreated: true }) },
    ]);
    const snapshot = consumer.snapshot();
    expect(snapshot).toEqual({
      running: true,
      listenerLastLoopAt: 0,
      queues: [
        expect.objectContaining({
          queue: 'orders',
          consumed: true,
          receivers: 2,
          notificationProblem: null,
          disabledSeen: false,
        }),
      ],
    });
    await consumer.stop(1_000);
    expect(consumer.snapshot().listenerLastLoopAt).toBeNull();
    double.assertDiscipline({ allEnded: true });
  });
});

describe('broker activation: default readers', () => {
  it('without createReceiver, each loop runs a BrokerReceiver on a connection of its own, waiting in autocommit', async () => {
    const clock = new FakeClock();
    const options = brokerOptions({ minReceivers: 2, maxReceivers: 2 });
    const double = new BrokerDriverDouble();
    double.on(/GET CONVERSATION GROUP/, () => clock.sleep(WAIT_MS).then(() => []));
    double.on(receiveNotifications(options.notificationQueue), () => clock.sleep(WAIT_MS).then(() => []));
    double.on(pollBrokerQueue(options.queues[0]!.queue), () => [pollRow()]);
    const consumer = new BrokerConsumer({
      maxBodyBytes: DEFAULT_MAX_PAYLOAD_BYTES,
      driver: double,
      options,
      clock,
      logger: new Logs(),
      onMoved: () => undefined,
      listeners: [],
    });
    consumer.register(options.queues[0]!, 5);
    consumer.start();
    await settle();
    expect(double.statements('connection').filter((t) => /GET CONVERSATION GROUP/.test(t))).toHaveLength(2);
    expect(double.connections).toHaveLength(2);
    await clock.advance(WAIT_MS);
    expect(readerCount(consumer)).toBe(2);
    await consumer.stop(1_000); // each receiver cancels its idle wait and closes its connection
    expect(double.calls.filter((c) => c.kind === 'cancel')).toHaveLength(3); // two receivers and the listener
    expect(double.statements('reader').filter((t) => /GET CONVERSATION GROUP/.test(t))).toEqual([]);
    double.assertDiscipline({ allEnded: true });
  });

  it('registerInitiator without a factory runs a BrokerInitiatorReader on the initiator queue', async () => {
    const clock = new FakeClock();
    const options = brokerOptions();
    const double = new BrokerDriverDouble();
    double.on(/\[orders_InitiatorQueue\]/, () => clock.sleep(WAIT_MS).then(() => []));
    const consumer = new BrokerConsumer({
      maxBodyBytes: DEFAULT_MAX_PAYLOAD_BYTES,
      driver: double,
      options,
      clock,
      logger: new Logs(),
      onMoved: () => undefined,
      listeners: [],
    });
    consumer.registerInitiator(options.queues[0]!);
    consumer.start();
    await settle();
    expect(double.statements('reader').filter((t) => t.includes('[orders_InitiatorQueue]'))).toHaveLength(1);
    await consumer.stop(1_000);
    double.assertDiscipline({ allEnded: true });
  });
});
