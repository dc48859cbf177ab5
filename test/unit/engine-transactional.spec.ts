/**
 * Transactional handlers (issue 25) in the engine: what the reader does with the handler's
 * transaction at each outcome, including a commit whose reply is lost (found out from the job's
 * row). The stores' transactions themselves are proven on real databases
 * (test/integration/transactional-handlers.postgres.spec.ts and the drill).
 */
import { describe, expect, it } from 'vitest';
import type { JobContext } from '../../lib/src/core/consumer/handler.js';
import { QueueConsumer } from '../../lib/src/core/consumer/queue-consumer.js';
import { SqlQueueConfigError } from '../../lib/src/core/errors.js';
import type { CompleteItem, FailItem, JobRecord, OwnedJob } from '../../lib/src/core/types.js';
import type { HandlerTransaction } from '../../lib/src/core/queue-store.js';
import { capturingLogger, consumerDeps, engineDeps, queueOptions, stopOnFakeClock } from '../helpers/engine.js';
import { SqlQueueConsumer } from '../../lib/src/core/consumer/consumer.js';
import { FakeClock } from '../helpers/fake-clock.js';
import { MemoryStore } from '../helpers/memory-store.js';

interface Script {
  begin?: () => void | Promise<void>;
  complete?: (item: CompleteItem) => 'ok' | 'lost' | Error;
  /** Awaited before the completion statement returns (its row stays locked meanwhile). */
  completed?: () => Promise<void>;
  commit?: () => Error | null;
  /** What getJob answers after a failed commit (an Error: the read fails too). */
  row?: (token: string) => Partial<JobRecord> | null | Error;
}

function transactionalStore(script: Script = {}) {
  const store = new MemoryStore();
  store.add(1);
  const log: string[] = [];
  const fails: FailItem[] = [];
  const releases: OwnedJob[] = [];
  let token = '';
  const handle = { kind: 'the handle' };
  Object.assign(store, {
    async beginHandlerTransaction(): Promise<HandlerTransaction> {
      await script.begin?.();
      log.push('begin');
      return {
        handle,
        async complete(item: CompleteItem) {
          token = item.claimToken;
          log.push('complete');
          const outcome = script.complete?.(item) ?? 'ok';
          if (outcome instanceof Error) throw outcome;
          await script.completed?.();
          return { id: item.id, outcome };
        },
        async commit() {
          log.push('commit');
          const error = script.commit?.() ?? null;
          if (error) throw error;
        },
        async rollback() {
          log.push('rollback');
        },
        async readBack(id: string) {
          log.push('readBack');
          const row = script.row?.(token) ?? null;
          if (row instanceof Error) throw row;
          return row === null ? null : ({ id, ...row } as JobRecord);
        },
      };
    },
    async complete(items: readonly OwnedJob[]) {
      log.push('complete outside');
      return items.map((i) => ({ id: i.id, outcome: 'ok' as const }));
    },
    async fail(items: readonly FailItem[]) {
      fails.push(...items);
      return items.map((i) => ({ id: i.id, outcome: 'ok' as const, state: 'ready' as const }));
    },
    async release(items: readonly OwnedJob[]) {
      releases.push(...items);
      return items.map((i) => ({ id: i.id, outcome: 'ok' as const }));
    },
  });
  return { store, log, fails, releases, handle };
}

async function runOne(
  store: MemoryStore,
  handler: (payload: unknown, ctx: JobContext) => Promise<unknown>,
  options: Record<string, unknown> = { transactional: true },
  runMs = 200,
) {
  const clock = new FakeClock();
  const events = { completed: [] as unknown[], lost: [] as unknown[] };
  const { logger, lines } = capturingLogger('warn');
  const consumer = new QueueConsumer(
    engineDeps(store, clock, {
      logger,
      listeners: [{ completed: (e) => events.completed.push(e), lostOwnership: (e) => events.lost.push(e) }],
    }),
    queueOptions({ minReaders: 1, maxReaders: 1, ...options }),
    handler,
  );
  consumer.start();
  for (let ms = 0; ms < runMs; ms += 100) await clock.advance(100);
  await stopOnFakeClock(consumer, clock);
  return { events, warnings: lines };
}

/** Resolves when `open()` is called; until then whoever awaits `opened` waits. */
function gate() {
  let open!: () => void;
  const opened = new Promise<void>((resolve) => (open = resolve));
  return { opened, open };
}

describe('transactional handlers in the engine', () => {
  it('gives the handler its transaction, records the completion in it and commits: no separate completion', async () => {
    const { store, log, handle } = transactionalStore();
    let seen: unknown;
    const { events } = await runOne(store, async (_payload, ctx) => {
      seen = ctx.transaction;
      return { ok: 1 };
    });
    expect(seen).toBe(handle);
    expect(log).toEqual(['begin', 'complete', 'commit']);
    expect(events.completed).toHaveLength(1);
  });

  it('a handler that throws: its transaction rolls back and the failure is recorded as always', async () => {
    const { store, log, fails } = transactionalStore();
    await runOne(store, async () => {
      throw new Error('boom');
    });
    expect(log).toEqual(['begin', 'rollback']);
    expect(fails.map((f) => f.error)).toEqual(['boom']);
  });

  it('a completion the token check refuses: rolled back, counted as lost ownership, nothing else recorded', async () => {
    const { store, log, fails } = transactionalStore({ complete: () => 'lost' });
    const { events } = await runOne(store, async () => undefined);
    expect(log).toEqual(['begin', 'complete', 'rollback']);
    expect(events.lost).toEqual([expect.objectContaining({ during: 'complete' })]);
    expect(events.completed).toEqual([]);
    expect(fails).toEqual([]);
  });

  it('a commit whose reply was lost but which committed: found in the job row, counted as completed', async () => {
    const { store, log, fails } = transactionalStore({
      commit: () => new Error('Connection terminated unexpectedly'),
      row: (token) => ({ state: 'done', claimToken: token }),
    });
    const { events, warnings } = await runOne(store, async () => undefined);
    expect(log).toEqual(['begin', 'complete', 'commit', 'readBack']);
    expect(events.completed).toHaveLength(1);
    expect(fails).toEqual([]);
    expect(warnings.some((w) => w.includes('but it committed'))).toBe(true);
  });

  it('a commit that did not happen (the row still leased with this token): a failure of the attempt, retried', async () => {
    const { store, fails } = transactionalStore({
      commit: () => new Error('deadlock victim'),
      row: (token) => ({ state: 'leased', claimToken: token }),
    });
    const { events } = await runOne(store, async () => undefined);
    expect(events.completed).toEqual([]);
    expect(fails).toHaveLength(1);
    expect(fails[0]!.error).toMatch(/the handler's transaction did not commit \(the commit failed\): deadlock victim/);
    expect(fails[0]!.dead).toBe(false);
  });

  it('a commit whose outcome cannot be read: nothing recorded, the lease decides', async () => {
    const { store, fails, releases } = transactionalStore({
      commit: () => new Error('socket hang up'),
      row: () => new Error('database unreachable'),
    });
    const { events, warnings } = await runOne(store, async () => undefined);
    expect(events.completed).toEqual([]);
    expect(fails).toEqual([]);
    expect(releases).toEqual([]);
    expect(warnings.some((w) => w.includes('its outcome cannot be read'))).toBe(true);
  });

  it('a completion statement that fails: rolled back and recorded as a failure of the attempt', async () => {
    const { store, log, fails } = transactionalStore({ complete: () => new Error('lock timeout') });
    await runOne(store, async () => undefined);
    expect(log).toEqual(['begin', 'complete', 'rollback']);
    expect(fails[0]!.error).toMatch(/recording the completion failed\): lock timeout/);
  });

  it('a transaction that cannot be opened: the job goes back unstarted, its handler never runs', async () => {
    const { store, releases } = transactionalStore({
      begin: () => {
        throw new Error('pool exhausted');
      },
    });
    let ran = false;
    const { warnings } = await runOne(store, async () => {
      ran = true;
    });
    expect(ran).toBe(false);
    expect(releases).toHaveLength(1);
    expect(warnings.some((w) => w.includes('could not open its handler'))).toBe(true);
  });

  it('a handler that returns after its timeout: rolled back, never completed (the timeout is its failure)', async () => {
    const { store, log, fails } = transactionalStore();
    const { events } = await runOne(
      store,
      async (_payload, ctx) => {
        await new Promise((resolve) => ctx.signal.addEventListener('abort', resolve));
        return 'too late';
      },
      { transactional: true, leaseMs: 600, maxDurationMs: 1_000 },
      2_000,
    );
    expect(log).toEqual(['begin', 'rollback']);
    expect(events.completed).toEqual([]);
    expect(fails).toHaveLength(1);
    expect(fails[0]!.error).toMatch(/exceeded maxDurationMs=1000/);
  });

  it('a transaction that opens after shutdown began: rolled back, the job given back, its handler never runs', async () => {
    const opening = gate();
    const { store, log, releases } = transactionalStore({ begin: () => opening.opened });
    const clock = new FakeClock();
    let ran = false;
    const consumer = new QueueConsumer(
      engineDeps(store, clock),
      queueOptions({ minReaders: 1, maxReaders: 1, transactional: true }),
      async () => {
        ran = true;
      },
    );
    consumer.start();
    await clock.advance(100);
    const stopped = consumer.stop(0);
    await clock.advance(100);
    opening.open();
    await clock.advance(20_000);
    await stopped;
    expect(ran).toBe(false);
    expect(log).toEqual(['begin', 'rollback']);
    expect(releases.map((r) => r.id)).toEqual(['1']);
  });

  it('leaves a job whose completion is committing out of heartbeats (its row is locked until the commit)', async () => {
    const committing = gate();
    let completing = false;
    const { store, log } = transactionalStore({
      complete: () => {
        completing = true;
        return 'ok';
      },
      completed: () => committing.opened,
    });
    const renewedWhileCommitting: string[] = [];
    const heartbeat = store.heartbeat.bind(store);
    store.heartbeat = async (items) => {
      if (completing) renewedWhileCommitting.push(...items.map((i) => i.id));
      return heartbeat(items);
    };
    const clock = new FakeClock();
    const consumer = new QueueConsumer(
      engineDeps(store, clock),
      queueOptions({ minReaders: 1, maxReaders: 1, transactional: true, leaseMs: 600 }),
      async () => undefined,
    );
    consumer.start();
    for (let ms = 0; ms < 1_500; ms += 100) await clock.advance(100);
    expect(completing).toBe(true);
    committing.open();
    await clock.advance(100);
    await stopOnFakeClock(consumer, clock);
    expect(renewedWhileCommitting).toEqual([]);
    expect(log).toEqual(['begin', 'complete', 'commit']);
  });

  it('on a single-session store (PGlite) a handler longer than its lease is not aborted while its transaction holds the session', async () => {
    const { store, log, fails } = transactionalStore();
    // As on PGlite: no other statement runs while the transaction is open, the heartbeat included.
    Object.assign(store, { singleSession: true });
    store.heartbeat = () => new Promise(() => undefined);
    const finish = gate();
    const clock = new FakeClock();
    const events = { completed: [] as unknown[] };
    const consumer = new QueueConsumer(
      engineDeps(store, clock, { listeners: [{ completed: (e) => events.completed.push(e) }] }),
      queueOptions({ minReaders: 1, maxReaders: 1, transactional: true, leaseMs: 600 }),
      async (_payload, ctx) => {
        await Promise.race([
          finish.opened,
          new Promise((_, reject) => ctx.signal.addEventListener('abort', () => reject(ctx.signal.reason))),
        ]);
      },
    );
    consumer.start();
    for (let ms = 0; ms < 3_000; ms += 100) await clock.advance(100);
    finish.open();
    await clock.advance(100);
    await stopOnFakeClock(consumer, clock);
    expect(fails).toEqual([]);
    expect(log).toEqual(['begin', 'complete', 'commit']);
    expect(events.completed).toHaveLength(1);
  });

  it('without the option, the handler gets no transaction and the completion goes out as always', async () => {
    const { store, log } = transactionalStore();
    let seen: unknown = 'unset';
    await runOne(
      store,
      async (_payload, ctx) => {
        seen = ctx.transaction;
      },
      { transactional: false },
    );
    expect(seen).toBeNull();
    expect(log).toEqual(['complete outside']);
  });

  it("refuses transactional queues whose maxReaders leave fewer than two of the pool's connections", () => {
    const { store } = transactionalStore();
    Object.assign(store, { poolSize: 7 });
    const consumer = new SqlQueueConsumer(consumerDeps(store, new FakeClock()));
    consumer.register(queueOptions({ transactional: true, maxReaders: 3 }, 'a'), async () => undefined);
    consumer.register(queueOptions({ maxReaders: 50 }, 'plain'), async () => undefined);
    expect(() =>
      consumer.register(queueOptions({ transactional: true, maxReaders: 3 }, 'b'), async () => undefined),
    ).toThrow(/\('a', 'b'\) may run 6 handler\(s\) at once .* the store's pool has 7: give the pool at least 8/);
    consumer.register(queueOptions({ transactional: true, maxReaders: 2 }, 'c'), async () => undefined);
  });

  it('refuses the option for a store that cannot open handler transactions', () => {
    expect(
      () =>
        new QueueConsumer(
          engineDeps(new MemoryStore(), new FakeClock()),
          queueOptions({ transactional: true }),
          async () => undefined,
        ),
    ).toThrow(SqlQueueConfigError);
  });
});
