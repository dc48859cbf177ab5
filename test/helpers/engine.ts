import { afterEach, beforeEach } from 'vitest';
import type { Clock } from '../../lib/src/core/clock.js';
import type { ConsumerDeps } from '../../lib/src/core/consumer/consumer.js';
import { silentLogger, type QueueLogger } from '../../lib/src/core/logger.js';
import {
  resolveConsumerOptions,
  resolveQueueOptions,
  type QueueOptions,
  type ResolvedQueueOptions,
} from '../../lib/src/core/options.js';
import type { QueueConsumerDeps } from '../../lib/src/core/consumer/queue-consumer.js';
import type { QueueStore } from '../../lib/src/core/queue-store.js';
import type { ClaimedJob, HeartbeatItem, OwnedJob } from '../../lib/src/core/types.js';
import { WakeBus } from '../../lib/src/core/wake.js';
import type { FakeClock } from './fake-clock.js';

/**
 * Shared setup for the engine's tests (QueueConsumer, SqlQueueConsumer): dependencies, queue
 * options, hand-built claimed jobs and a fake store with fenced (token-checked) outcomes.
 */

/**
 * The dependencies every engine test shares: silent, no listeners, worker 'unit', activation
 * every 1 s with a 3 s quiet period.
 */
function baseDeps(store: object, clock: Clock): QueueConsumerDeps {
  return {
    store: store as QueueStore,
    clock,
    logger: silentLogger,
    listeners: [],
    workerId: 'unit',
  };
}

/**
 * Dependencies of `new QueueConsumer(deps, options, handler)`: baseDeps with no jitter
 * (`random: () => 0`). `store` may be a partial fake; `overrides` replaces any field.
 */
export function engineDeps(store: object, clock: Clock, overrides: Partial<QueueConsumerDeps> = {}): QueueConsumerDeps {
  return { ...baseDeps(store, clock), random: () => 0, ...overrides };
}

/**
 * Dependencies of `new SqlQueueConsumer(deps)`: baseDeps with a fresh WakeBus and the engine's
 * own jitter (no `random`). Listening for wake-ups is left on unless overridden.
 */
export function consumerDeps(store: object, clock: Clock, overrides: Partial<ConsumerDeps> = {}): ConsumerDeps {
  return { ...baseDeps(store, clock), wakeBus: new WakeBus(), ...overrides };
}

/** A queue's effective options with `handler` as its handler-level options and consumer defaults. */
export function queueOptions(handler?: QueueOptions, queue = 'q'): ResolvedQueueOptions {
  return resolveQueueOptions(queue, { handler }, resolveConsumerOptions({}));
}

/**
 * A job as a claim returns it, claimed now in queue 'q' (attempt 1 of 5) with a lease of
 * `leaseMs` (60 s); `fields` sets anything else.
 */
export function claimedJob(
  id: string,
  claimToken: string,
  { leaseMs = 60_000, ...fields }: Partial<ClaimedJob> & { leaseMs?: number } = {},
): ClaimedJob {
  const now = new Date();
  return {
    id,
    queue: 'q',
    payload: {},
    priority: 0,
    groupKey: null,
    idempotencyKey: null,
    attempt: 1,
    maxAttempts: 5,
    claimToken,
    enqueuedAt: now,
    claimedAt: now,
    leaseUntil: new Date(now.getTime() + leaseMs),
    ...fields,
  };
}

/**
 * A fake store the test drives by hand: each claim returns the next batch of `queued` (none:
 * an empty claim), and a heartbeat or completion is 'ok' only while `tokens` holds the item's
 * claim token, as the database's fenced statements answer. Setting another token for a job
 * models the reaper handing it on. Failures and give-backs are checked the same way unless
 * `checkFailAndRelease` is false (then they always answer 'ok'). It never reports claimable work.
 */
export class TokenStore {
  /** The current claim token of each job. */
  readonly tokens = new Map<string, string>();
  /** The answers of the next claims, one batch each. */
  readonly queued: ClaimedJob[][] = [];
  private readonly checkFailAndRelease: boolean;

  constructor({ checkFailAndRelease = true }: { checkFailAndRelease?: boolean } = {}) {
    this.checkFailAndRelease = checkFailAndRelease;
  }

  async claim(): Promise<ClaimedJob[]> {
    return this.queued.shift() ?? [];
  }

  async heartbeat(items: readonly HeartbeatItem[]) {
    return items.map((i) => ({ id: i.id, outcome: this.owned(i), leaseUntil: new Date() }));
  }

  async complete(items: readonly OwnedJob[]) {
    return items.map((i) => ({ id: i.id, outcome: this.owned(i) }));
  }

  async fail(items: readonly OwnedJob[]) {
    return items.map((i) => ({ id: i.id, outcome: this.settled(i), state: 'ready' as const }));
  }

  async release(items: readonly OwnedJob[]) {
    return items.map((i) => ({ id: i.id, outcome: this.settled(i) }));
  }

  async hasClaimableWork(): Promise<boolean> {
    return false;
  }

  private owned(item: OwnedJob): 'ok' | 'lost' {
    return this.tokens.get(item.id) === item.claimToken ? 'ok' : 'lost';
  }

  private settled(item: OwnedJob): 'ok' | 'lost' {
    return this.checkFailAndRelease ? this.owned(item) : 'ok';
  }
}

/** A logger that keeps the messages of the given levels in `lines` and drops the rest. */
export function capturingLogger(...levels: ('log' | 'warn' | 'error')[]): { logger: QueueLogger; lines: string[] } {
  const lines: string[] = [];
  const logger: QueueLogger = { ...silentLogger };
  for (const level of levels) logger[level] = (message: string) => void lines.push(message);
  return { logger, lines };
}

/** Settles only by rejecting with the signal's reason once it aborts: a handler that obeys its signal. */
export function untilAborted(signal: AbortSignal): Promise<void> {
  return new Promise<void>((_, reject) => signal.addEventListener('abort', () => reject(signal.reason)));
}

/**
 * Stops a consumer that runs on a fake clock, without waiting for handlers (stop(0)): shutdown
 * waits on the engine clock too, so time moves (20 s) while it stops.
 */
export async function stopOnFakeClock(consumer: { stop(timeoutMs: number): Promise<unknown> }, clock: FakeClock) {
  const stopping = consumer.stop(0);
  await clock.advance(20_000);
  await stopping;
}

/** The timers (sleeps and intervals) still pending on a fake clock, as their delays from now. */
export function pendingTimers(clock: FakeClock): number[] {
  return (clock as unknown as { timers: { at: number }[] }).timers.map((t) => t.at - clock.now());
}

/**
 * Collects the process's unhandled rejections during each test of the enclosing describe()
 * (registers its own beforeEach/afterEach); the returned array is emptied before each test.
 */
export function recordUnhandledRejections(): unknown[] {
  const rejections: unknown[] = [];
  const onRejection = (reason: unknown) => rejections.push(reason);
  beforeEach(() => {
    rejections.length = 0;
    process.on('unhandledRejection', onRejection);
  });
  afterEach(() => {
    process.off('unhandledRejection', onRejection);
  });
  return rejections;
}
