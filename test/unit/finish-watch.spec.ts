import { describe, expect, it } from 'vitest';
import { FinishWatch } from '../../lib/src/core/producer/index.js';
import { WakeChannel, type WakeListen } from '../../lib/src/core/wake.js';

/** A broadcast channel between processes, as PostgreSQL NOTIFY is: every listener hears every name. */
function broadcastBus() {
  const listeners = new Set<(name: string) => void>();
  const sent: string[] = [];
  let opened = 0;
  const listen: WakeListen = async (onWake) => {
    opened++;
    listeners.add(onWake);
    return async () => void listeners.delete(onWake);
  };
  const broadcast = async (name: string) => {
    sent.push(name);
    for (const listener of [...listeners]) listener(name);
  };
  return { listen, broadcast, sent, opened: () => opened, listening: () => listeners.size };
}

const logger = { log: () => undefined, warn: () => undefined, error: () => undefined };
const settle = () => new Promise((resolve) => setTimeout(resolve, 20));

function processOn(bus: ReturnType<typeof broadcastBus>, now?: () => number) {
  const channel = new WakeChannel(() => bus.listen);
  return new FinishWatch({ broadcast: bus.broadcast, listen: channel.listen!, logger, now });
}

describe('FinishWatch', () => {
  it("wakes a waiter when another process that heard its ask records the job's final outcome", async () => {
    const bus = broadcastBus();
    const consumer = processOn(bus);
    expect(await consumer.listen({ consuming: true })).toBe(true); // when its readers start
    const waiter = processOn(bus);
    let woken = 0;
    const watcher = waiter.watch('42', () => woken++);
    await settle();
    expect(bus.sent).toEqual(['!await:42']);
    // Once the ask is out, the waiter is told to read again (the job may have finished before it).
    expect(woken).toBe(1);
    // Not live until an answer from another process was heard: only then do consumers answer.
    expect(watcher.live).toBe(false);

    consumer.failed({ jobId: '42', dead: false }); // a retry is not a finish
    consumer.completed({ jobId: '7' }); // nobody asked for 7
    await settle();
    expect(bus.sent).toEqual(['!await:42']);
    consumer.completed({ jobId: '42' });
    await settle();
    expect(bus.sent).toEqual(['!await:42', '!done:42']);
    expect(woken).toBe(2);
    expect(watcher.live).toBe(true);
    // Answered once: the id is forgotten.
    consumer.completed({ jobId: '42' });
    await settle();
    expect(bus.sent).toHaveLength(2);
    watcher.stop();
  });

  it('costs nothing without waiters: no notification, and no listening connection of its own', async () => {
    const bus = broadcastBus();
    const watch = processOn(bus);
    for (let id = 1; id <= 1000; id++) watch.completed({ jobId: String(id) });
    watch.canceled({ jobId: '5' });
    await settle();
    expect(bus.sent).toEqual([]);
    expect(bus.opened()).toBe(0);
  });

  it('forgets an ask after its time-to-live, so a late finish is not announced', async () => {
    const bus = broadcastBus();
    let now = 1_000_000;
    const consumer = processOn(bus, () => now);
    await consumer.listen({ consuming: true });
    const waiter = processOn(bus);
    waiter.watch('9', () => undefined);
    await settle();
    now += 61_000;
    consumer.completed({ jobId: '9' });
    await settle();
    expect(bus.sent).toEqual(['!await:9']);
  });

  it('wakes a waiter in its own process without any notification, on every dialect', async () => {
    const watch = new FinishWatch({ broadcast: null, listen: null, logger });
    let woken = 0;
    const watcher = watch.watch('11', () => woken++);
    expect(watcher.live).toBe(false);
    watch.failed({ jobId: '11', dead: true });
    expect(woken).toBe(1);
    watcher.stop();
    watch.completed({ jobId: '11' });
    expect(woken).toBe(1);
  });

  it('batches ids into notifications below the PostgreSQL payload limit; announce: true answers unasked', async () => {
    const bus = broadcastBus();
    const watch = processOn(bus);
    const ids = Array.from({ length: 1000 }, (_, i) => String(9_000_000_000_000_000_000n + BigInt(i)));
    for (const id of ids) watch.finished(id, { announce: true });
    await settle();
    expect(bus.sent.length).toBeGreaterThan(1);
    for (const name of bus.sent) expect(Buffer.byteLength(name)).toBeLessThan(8000);
    expect(bus.sent.flatMap((name) => name.slice('!done:'.length).split(','))).toEqual(ids);
  });

  it('ignores malformed names and the names of queues', async () => {
    const watch = new FinishWatch({ broadcast: null, listen: null, logger });
    let woken = 0;
    watch.watch('3', () => woken++);
    watch.receive('!done:x,,3;drop');
    watch.receive('orders');
    expect(woken).toBe(0);
    watch.receive('!done:1,3');
    expect(woken).toBe(1);
  });

  it('notes asks only in a process whose readers run, and forgets expired ones as new ones come', async () => {
    const bus = broadcastBus();
    let now = 0;
    const producerOnly = processOn(bus, () => now);
    await producerOnly.listen();
    const consumer = processOn(bus, () => now);
    await consumer.listen({ consuming: true });
    producerOnly.receive('!await:1');
    consumer.receive('!await:1');
    now += 61_000;
    consumer.receive('!await:2'); // 1 expired: dropped now, not answered
    producerOnly.finished('1');
    consumer.finished('1');
    consumer.finished('2');
    await settle();
    expect(bus.sent).toEqual(['!done:2']);
  });

  it('closes bounded, and a listen that lands after close is closed at once', async () => {
    let stops = 0;
    let land!: () => void;
    const slow: WakeListen = () =>
      new Promise((resolve) => {
        land = () => resolve(async () => void stops++);
      });
    const watch = new FinishWatch({ broadcast: async () => undefined, listen: slow, logger });
    const watcher = watch.watch('5', () => undefined);
    const closing = watch.close();
    land();
    await closing;
    expect(stops).toBe(1);
    expect(watcher.live).toBe(false);
  });
});

describe('WakeChannel', () => {
  it('opens one connection for all its listeners and closes it with the last', async () => {
    const bus = broadcastBus();
    const channel = new WakeChannel(() => bus.listen);
    const a: string[] = [];
    const b: string[] = [];
    const [stopA, stopB] = await Promise.all([
      channel.listen!((name) => a.push(name)),
      channel.listen!((name) => b.push(name)),
    ]);
    expect(bus.opened()).toBe(1);
    await bus.broadcast('orders');
    expect([a, b]).toEqual([['orders'], ['orders']]);
    await stopA();
    expect(bus.listening()).toBe(1);
    await bus.broadcast('mail');
    expect([a, b]).toEqual([['orders'], ['orders', 'mail']]);
    await stopB();
    expect(bus.listening()).toBe(0);
    expect(new WakeChannel(() => undefined).listen).toBeUndefined();
  });

  it('lets a later listener retry after the connection failed to open', async () => {
    let attempts = 0;
    const bus = broadcastBus();
    const channel = new WakeChannel(() => async (onWake) => {
      if (++attempts === 1) throw new Error('connection refused');
      return bus.listen(onWake);
    });
    await expect(channel.listen!(() => undefined)).rejects.toThrow('connection refused');
    const heard: string[] = [];
    await channel.listen!((name) => heard.push(name));
    await bus.broadcast('q');
    expect(heard).toEqual(['q']);
  });
});
