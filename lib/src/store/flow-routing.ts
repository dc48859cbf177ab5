import type { ClaimedJob, ClaimRequest } from '../core/types.js';

/** What the ordinary claim statement answered: its jobs, and whether it handed the queue over. */
export interface OrdinaryClaim {
  claimed: ClaimedJob[];
  /** The queue holds keyed jobs, which only the flow claim takes, or recorded limits, which only it applies. */
  handOver: boolean;
}

/**
 * Which claim a store sends for a queue, the same on both dialects: the flow claim for a
 * consumer with limits of its own (`limited`) and for a queue the ordinary claim once handed
 * over (from then on, until the process restarts), else the ordinary claim, whose hand-over sends
 * the flow claim for the rest of the limit at once. Also keeps each queue's rate window hint
 * (when a full window frees its next start), for `claimRetryHintMs`.
 */
export class FlowRouting {
  private readonly flowQueues = new Set<string>();
  /** When a queue's full rate window frees its next start (Date.now() clock), from its last flow claim. */
  private readonly rateFreeAt = new Map<string, number>();

  async claim(
    request: ClaimRequest,
    ordinary: (request: ClaimRequest) => Promise<OrdinaryClaim>,
    flow: (request: ClaimRequest) => Promise<ClaimedJob[]>,
  ): Promise<ClaimedJob[]> {
    if (request.limited || this.flowQueues.has(request.queue)) return flow(request);
    const { claimed, handOver } = await ordinary(request);
    if (!handOver) return claimed;
    this.flowQueues.add(request.queue);
    const more =
      claimed.length < request.limit ? await flow({ ...request, limit: request.limit - claimed.length }) : [];
    return [...claimed, ...more];
  }

  /** What a flow claim answered about the queue's rate window: null when it was not full. */
  noteRateWindow(queue: string, freeInMs: number | null): void {
    if (freeInMs === null) this.rateFreeAt.delete(queue);
    else this.rateFreeAt.set(queue, Date.now() + Math.max(0, freeInMs));
  }

  retryHintMs(queue: string): number | null {
    const at = this.rateFreeAt.get(queue);
    return at === undefined ? null : Math.max(0, at - Date.now());
  }
}
