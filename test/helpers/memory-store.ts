import { randomUUID } from 'node:crypto';
import type { QueueStore } from '../../lib/src/core/queue-store.js';
import type { ClaimedJob, CompleteResult, HeartbeatResult, OwnedJob } from '../../lib/src/core/types.js';

/**
 * An in-memory stand-in for the engine's unit tests only (activation rule, polling), where
 * the point is the engine's timing on a fake clock. Every database behaviour is proven by the
 * contract suite against real databases, never by this.
 */
export class MemoryStore implements Partial<QueueStore> {
  readonly dialect = 'postgres' as const;
  readonly schema = 'memory';
  claims = 0;
  emptyClaims = 0;
  /** The `limit` of every claim, in order. */
  readonly claimLimits: number[] = [];
  /** When set, each claim takes this long on the test's clock before it looks (a round trip). */
  claimDelay: (() => Promise<void>) | null = null;
  private readonly ready: { id: string; payload: unknown }[] = [];
  private readonly leased = new Map<string, string>();
  private readonly payloads = new Map<string, unknown>();
  private seq = 0;

  add(count: number): void {
    for (let i = 0; i < count; i++) {
      const id = String(++this.seq);
      this.payloads.set(id, { i });
      this.ready.push({ id, payload: { i } });
    }
  }

  get readyCount(): number {
    return this.ready.length;
  }

  async claim(request: { limit: number }): Promise<ClaimedJob[]> {
    this.claims++;
    this.claimLimits.push(request.limit);
    await this.claimDelay?.();
    const taken = this.ready.splice(0, request.limit);
    if (taken.length === 0) this.emptyClaims++;
    return taken.map(({ id, payload }) => {
      const token = randomUUID();
      this.leased.set(id, token);
      const now = new Date();
      return {
        id,
        queue: 'q',
        payload,
        priority: 0,
        groupKey: null,
        idempotencyKey: null,
        attempt: 1,
        maxAttempts: 3,
        claimToken: token,
        enqueuedAt: now,
        claimedAt: now,
        leaseUntil: new Date(now.getTime() + 60_000),
      };
    });
  }

  async hasClaimableWork(): Promise<boolean> {
    return this.ready.length > 0;
  }

  async complete(items: readonly OwnedJob[]): Promise<CompleteResult[]> {
    return items.map((item) => {
      const ok = this.leased.get(item.id) === item.claimToken;
      this.leased.delete(item.id);
      return { id: item.id, outcome: ok ? 'ok' : 'lost' };
    });
  }

  /** Gives leased jobs back to the front of the ready list (attempt not counted), token-checked. */
  async release(items: readonly (OwnedJob & { delayMs?: number })[]): Promise<CompleteResult[]> {
    return items.map((item) => {
      const ok = this.leased.get(item.id) === item.claimToken;
      if (ok) {
        this.leased.delete(item.id);
        this.ready.unshift({ id: item.id, payload: this.payloads.get(item.id) });
      }
      return { id: item.id, outcome: ok ? ('ok' as const) : ('lost' as const) };
    });
  }

  async heartbeat(items: readonly OwnedJob[]): Promise<HeartbeatResult[]> {
    return items.map((item) => ({ id: item.id, outcome: 'ok' as const, leaseUntil: new Date() }));
  }

  async fail(items: readonly OwnedJob[]) {
    return items.map((item) => ({ id: item.id, outcome: 'ok' as const, state: 'ready' as const }));
  }

  isTransientError(): boolean {
    return false;
  }
}
