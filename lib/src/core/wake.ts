import type { QueueLogger } from './logger.js';
import type { QueueStore } from './queue-store.js';

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
 * Wakes readers in other processes through the store (PostgreSQL NOTIFY), outside any
 * producer transaction and coalesced: at most one notification per queue per `intervalMs`
 * (the first at once, one trailing for whatever arrived meanwhile). A NOTIFY inside every
 * enqueue transaction would serialize all producers' commits on the notification queue lock.
 */
export class RemoteWaker {
  private readonly lastSentAt = new Map<string, number>();
  private readonly trailing = new Map<string, NodeJS.Timeout>();
  private closed = false;

  constructor(
    private readonly store: Pick<QueueStore, 'notify'>,
    private readonly intervalMs: number,
    private readonly logger: QueueLogger,
    private readonly now: () => number = Date.now,
  ) {}

  request(queue: string): void {
    if (this.closed || !this.store.notify || this.trailing.has(queue)) return;
    const since = this.now() - (this.lastSentAt.get(queue) ?? -Infinity);
    if (since >= this.intervalMs) {
      this.send(queue);
      return;
    }
    const timer = setTimeout(() => {
      this.trailing.delete(queue);
      this.send(queue);
    }, this.intervalMs - since);
    timer.unref();
    this.trailing.set(queue, timer);
  }

  private send(queue: string): void {
    if (this.closed) return;
    this.lastSentAt.set(queue, this.now());
    this.store.notify!(queue).catch((error: Error) => {
      // Only a hint: readers elsewhere still poll, so a lost wake-up costs latency, not jobs.
      this.logger.debug?.(`wake-up notification for queue '${queue}' failed: ${error.message}`);
    });
  }

  close(): void {
    this.closed = true;
    for (const timer of this.trailing.values()) clearTimeout(timer);
    this.trailing.clear();
  }
}
