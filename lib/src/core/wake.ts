import { systemClock, type Clock } from './clock.js';
import type { QueueLogger } from './logger.js';
import type { QueueStore } from './queue-store.js';
import { withTimeout } from './timeout.js';

/**
 * A wake-up that says "a leased job of this queue may have been canceled": its holders
 * heartbeat at once to find out. '!' is no queue name's, so an older instance that receives
 * one wakes no queue.
 */
const CANCEL_WAKE_PREFIX = '!cancel:';

export function cancelWakeName(queue: string): string {
  return `${CANCEL_WAKE_PREFIX}${queue}`;
}

/** The queue a cancel wake-up names, or null for an ordinary wake-up. */
export function canceledQueueOf(name: string): string | null {
  return name.startsWith(CANCEL_WAKE_PREFIX) ? name.slice(CANCEL_WAKE_PREFIX.length) : null;
}

/** In-process wake-ups: an enqueue wakes this process's readers of that queue at once. */
export class WakeBus {
  private readonly listeners = new Map<string, Set<() => void>>();

  subscribe(queue: string, listener: () => void): () => void {
    let set = this.listeners.get(queue);
    if (!set) this.listeners.set(queue, (set = new Set()));
    set.add(listener);
    return () => {
      set.delete(listener);
      if (set.size === 0) this.listeners.delete(queue);
    };
  }

  wake(queue: string): void {
    for (const listener of this.listeners.get(queue) ?? []) listener();
  }
}

/**
 * Default spacing of one queue's notifications: below the gap between jobs at a few hundred
 * jobs/s (so a lone enqueue is never held back), and enough to keep bursts of single enqueues
 * from spending a NOTIFY transaction on most jobs.
 */
export const DEFAULT_WAKE_INTERVAL_MS = 2;

/** A wake-up notification that has not answered by then is abandoned (it is only a hint). */
const NOTIFY_TIMEOUT_MS = 5_000;

/**
 * Wakes readers in other processes through the store (PostgreSQL NOTIFY), outside any
 * producer transaction: a NOTIFY inside every enqueue transaction would serialize all
 * producers' commits on the notification queue lock.
 *
 * Coalesced per queue, without adding latency to a lone enqueue: the first request is sent at
 * once; requests while it is on its way are answered by one more notification after it (a
 * job committed after a NOTIFY was sent may not be visible to the claim that NOTIFY causes).
 * So a queue has at most one notification in flight, and at most one per `intervalMs` when
 * that is set. Requests made before a waiting notification is sent ride on it.
 */
export class RemoteWaker {
  private readonly lastSentAt = new Map<string, number>();
  private readonly state = new Map<string, 'waiting' | 'sending'>();
  private readonly again = new Set<string>();
  private readonly closing = new AbortController();

  constructor(
    private readonly store: Pick<QueueStore, 'notify'>,
    private readonly intervalMs: number,
    private readonly logger: QueueLogger,
    private readonly clock: Clock = systemClock,
  ) {}

  request(queue: string): void {
    if (this.closing.signal.aborted || !this.store.notify) return;
    const state = this.state.get(queue);
    if (state === 'waiting') return;
    if (state === 'sending') {
      this.again.add(queue);
      return;
    }
    void this.send(queue);
  }

  private async send(queue: string): Promise<void> {
    this.state.set(queue, 'waiting');
    const wait = (this.lastSentAt.get(queue) ?? -Infinity) + this.intervalMs - this.clock.now();
    if (wait > 0) await this.clock.sleep(wait, this.closing.signal);
    if (this.closing.signal.aborted) return;
    this.state.set(queue, 'sending');
    this.lastSentAt.set(queue, this.clock.now());
    try {
      await withTimeout(this.store.notify!(queue), NOTIFY_TIMEOUT_MS, `wake-up notification for queue '${queue}'`);
    } catch (error) {
      // Only a hint: readers elsewhere still poll, so a lost wake-up costs latency, not jobs.
      this.logger.debug?.(`wake-up notification for queue '${queue}' failed: ${(error as Error).message}`);
    }
    this.state.delete(queue);
    if (this.again.delete(queue)) this.request(queue);
  }

  close(): void {
    this.closing.abort();
    this.again.clear();
  }
}

/** Listens for wake-ups from other processes; the returned function stops listening. */
export type WakeListen = (onWake: (name: string) => void) => Promise<() => Promise<void>>;

/**
 * The process's one wake-up connection (a LISTEN, or the doorbell's reader), shared by its
 * readers and its waitFor() waiters: the first to listen opens it, the last to stop closes it.
 */
export class WakeChannel {
  private readonly callbacks = new Set<(name: string) => void>();
  private opened: Promise<() => Promise<void>> | null = null;

  /** `open`: the channel as it is now (the doorbell connects after this is built); undefined: none. */
  constructor(private readonly open: () => WakeListen | undefined) {}

  /** The channel's listen, or undefined when the process has none. */
  get listen(): WakeListen | undefined {
    return this.open() ? this.join : undefined;
  }

  private readonly join: WakeListen = async (onWake) => {
    this.callbacks.add(onWake);
    const opened = (this.opened ??= this.open()!((name) => {
      for (const callback of this.callbacks) callback(name);
    }));
    try {
      await opened;
    } catch (error) {
      this.callbacks.delete(onWake);
      // Only this attempt's: a later listener may have opened the channel again meanwhile.
      if (this.opened === opened) this.opened = null;
      throw error;
    }
    return async () => {
      if (!this.callbacks.delete(onWake) || this.callbacks.size > 0 || !this.opened) return;
      const opened = this.opened;
      this.opened = null;
      await (
        await opened
      )();
    };
  };
}
