import type { QueueEventListener } from '../events.js';
import type { QueueLogger } from '../logger.js';
import { settleWithin, withTimeout } from '../timeout.js';
import type { WakeListen } from '../wake.js';

/** A waiter's ask: consumers note these job ids. '!' is in no queue name, so older instances ignore it. */
const ASK_PREFIX = '!await:';
/** A consumer's answer: these job ids finished. */
const ANSWER_PREFIX = '!done:';
/** How long a consumer keeps an asked-for id; a waiter asks again before that while it waits. */
export const ASK_TTL_MS = 60_000;
export const ASK_AGAIN_MS = 30_000;
/** Ids a consumer keeps for waiters elsewhere; beyond that the oldest are dropped (their waiters poll). */
const MAX_NOTED = 100_000;
/** PostgreSQL refuses a NOTIFY payload of 8000 bytes or more; ids are at most 19 digits. */
const MAX_PAYLOAD_CHARS = 7_000;
const SEND_TIMEOUT_MS = 5_000;
/** How long shutdown waits for the channel to open or close (a half-open socket must not hold it). */
const CLOSE_TIMEOUT_MS = 5_000;

export interface FinishWatchDeps {
  /**
   * Sends a wake-up to every process (PostgreSQL NOTIFY). Null where none reaches them all (a
   * Service Broker doorbell ring reaches one listener) or wake-ups are off: waiters then learn
   * of a finish in their own process at once and of others' by polling.
   */
  broadcast: ((name: string) => Promise<void>) | null;
  /** The process's wake-up channel, shared with its readers. */
  listen: WakeListen | null;
  logger: QueueLogger;
  now?: () => number;
}

/** What waitFor() holds while it waits. */
export interface FinishWatcher {
  /**
   * True once its ask went out and this process has heard an answer from another process (so
   * consumers there do answer): waitFor then polls less often.
   */
  readonly live: boolean;
  /** Asks the consumers again (they forget an ask after ASK_TTL_MS). */
  askAgain(): void;
  stop(): void;
}

/**
 * Tells waitFor() callers that their job finished, across processes, at no cost to anyone who
 * does not wait: a waiter asks for its job id on the wake-up channel; every consumer process
 * notes the id for a minute, and the one that records its final outcome (completed, dead,
 * canceled) answers with it. Asks and answers are batched (one notification in flight each,
 * carrying every id that came meanwhile). A finish in the waiter's own process wakes it
 * directly. Only a hint: waitFor() still polls, for an answer lost or sent before the ask arrived.
 */
export class FinishWatch implements QueueEventListener {
  private readonly waiters = new Map<string, Set<() => void>>();
  /** Ids waiters elsewhere asked for, with when the ask runs out. */
  private readonly noted = new Map<string, number>();
  private readonly asks: IdAnnouncer | null;
  private readonly answers: IdAnnouncer | null;
  private listening: Promise<boolean> | null = null;
  private stopListening: (() => Promise<void>) | null = null;
  private closed = false;
  /** Asks are noted only where jobs are finished: in a process whose readers run. */
  private consuming = false;
  /** An answer from another process was heard: consumers elsewhere answer asks. */
  private answered = false;
  private readonly now: () => number;

  constructor(private readonly deps: FinishWatchDeps) {
    this.now = deps.now ?? Date.now;
    const send = deps.listen ? deps.broadcast : null;
    this.asks = send ? new IdAnnouncer(ASK_PREFIX, send, deps.logger) : null;
    this.answers = send ? new IdAnnouncer(ANSWER_PREFIX, send, deps.logger) : null;
  }

  /** The channel callback: asks and answers from other processes (other names are not ours). */
  readonly receive = (name: string): void => {
    if (name.startsWith(ASK_PREFIX)) {
      if (!this.consuming) return;
      const until = this.now() + ASK_TTL_MS;
      for (const id of idsOf(name, ASK_PREFIX)) this.note(id, until);
    } else if (name.startsWith(ANSWER_PREFIX)) {
      for (const id of idsOf(name, ANSWER_PREFIX)) {
        if (this.waiters.has(id)) this.answered = true;
        this.wakeLocal(id);
      }
    }
  };

  /**
   * Starts watching a job: `onFinish` may be called more than once, and for a job that did not
   * finish (a re-read is cheap). Returns at once: the ask goes out once this process listens
   * (so the answer cannot come before), and `onFinish` is called when it has, for a re-read that
   * covers a finish the ask came too late for.
   */
  watch(id: string, onFinish: () => void): FinishWatcher {
    let set = this.waiters.get(id);
    if (!set) this.waiters.set(id, (set = new Set()));
    set.add(onFinish);
    let asked = false;
    let stopped = false;
    const ask = () => {
      if (stopped || !this.asks) return;
      void this.listen().then(async (listening) => {
        if (!listening || stopped) return;
        await this.asks!.add(id);
        asked = true;
        if (!stopped) onFinish();
      });
    };
    ask();
    const answered = () => this.answered;
    return {
      get live() {
        return asked && answered();
      },
      askAgain: ask,
      stop: () => {
        stopped = true;
        set.delete(onFinish);
        if (set.size === 0 && this.waiters.get(id) === set) this.waiters.delete(id);
      },
    };
  }

  /** A job reached a final state here: wake its waiters here, and answer waiters elsewhere that asked. */
  finished(id: string, { announce = false }: { announce?: boolean } = {}): void {
    this.wakeLocal(id);
    const until = this.noted.get(id);
    if (until !== undefined) this.noted.delete(id);
    if (announce || (until !== undefined && until > this.now())) this.answers?.add(id);
  }

  completed(event: { jobId: string }): void {
    this.finished(event.jobId);
  }

  failed(event: { jobId: string; dead: boolean }): void {
    if (event.dead) this.finished(event.jobId);
  }

  canceled(event: { jobId: string }): void {
    this.finished(event.jobId);
  }

  async close(): Promise<void> {
    this.closed = true;
    this.asks?.close();
    this.answers?.close();
    // A listen still opening closes itself when it lands (see listen()); wait for it, bounded.
    if (this.listening) await settleWithin(this.listening, CLOSE_TIMEOUT_MS);
    const stop = this.stopListening;
    this.stopListening = null;
    if (stop)
      await settleWithin(
        stop().catch(() => undefined),
        CLOSE_TIMEOUT_MS,
      );
  }

  /**
   * Hears asks and answers from now on: a consumer process calls it with `consuming` when its
   * readers start (it notes asks from then on); a waiter's first watch() calls it too. Once for
   * the process's life: the connection is the one its readers share, and a process that waited
   * once is likely to wait again.
   */
  listen({ consuming = false }: { consuming?: boolean } = {}): Promise<boolean> {
    if (consuming) this.consuming = true;
    if (!this.asks || this.closed) return Promise.resolve(false);
    this.listening ??= (async () => {
      try {
        const stop = await this.deps.listen!(this.receive);
        if (this.closed) await stop().catch(() => undefined);
        else this.stopListening = stop;
        return !this.closed;
      } catch (error) {
        this.deps.logger.debug?.(`waitFor: wake-up channel unavailable, polling: ${(error as Error).message}`);
        this.listening = null;
        return false;
      }
    })();
    return this.listening;
  }

  private wakeLocal(id: string): void {
    for (const onFinish of this.waiters.get(id) ?? []) onFinish();
  }

  private note(id: string, until: number): void {
    // Kept in ask order, so in expiry order: the expired (and, past the cap, the oldest) lead.
    this.noted.delete(id);
    this.noted.set(id, until);
    const now = this.now();
    for (const [noted, expires] of this.noted) {
      if (this.noted.size <= MAX_NOTED && expires > now) break;
      this.noted.delete(noted);
    }
  }
}

function idsOf(name: string, prefix: string): string[] {
  return name
    .slice(prefix.length)
    .split(',')
    .filter((id) => /^\d{1,19}$/.test(id));
}

/** Sends ids as `prefix` + comma-separated ids: one notification in flight, the ids added meanwhile in the next. */
class IdAnnouncer {
  private readonly pending = new Set<string>();
  /** Who waits for the notification that carries an id. */
  private readonly sent = new Map<string, (() => void)[]>();
  private sending = false;
  private closed = false;

  constructor(
    private readonly prefix: string,
    private readonly send: (name: string) => Promise<void>,
    private readonly logger: QueueLogger,
  ) {}

  /** Resolves once the notification that carries `id` was sent (or failed, or was dropped). */
  add(id: string): Promise<void> {
    if (this.closed) return Promise.resolve();
    this.pending.add(id);
    const done = new Promise<void>((resolve) => {
      const list = this.sent.get(id);
      if (list) list.push(resolve);
      else this.sent.set(id, [resolve]);
    });
    if (!this.sending) void this.flush();
    return done;
  }

  close(): void {
    this.closed = true;
    this.pending.clear();
    for (const list of this.sent.values()) for (const resolve of list) resolve();
    this.sent.clear();
  }

  private async flush(): Promise<void> {
    this.sending = true;
    // Ids added in the same turn of the event loop (a cancelMany, a completion batch) go together.
    await new Promise<void>((resolve) => setImmediate(resolve));
    while (this.pending.size > 0 && !this.closed) {
      const ids: string[] = [];
      let length = this.prefix.length;
      for (const id of this.pending) {
        if (ids.length > 0 && length + id.length + 1 > MAX_PAYLOAD_CHARS) break;
        ids.push(id);
        length += id.length + 1;
        this.pending.delete(id);
      }
      try {
        await withTimeout(this.send(this.prefix + ids.join(',')), SEND_TIMEOUT_MS, `'${this.prefix}' wake-up`);
      } catch (error) {
        // Only a hint: waiters poll for what a lost notification would have told them.
        this.logger.debug?.(`waitFor wake-up failed: ${(error as Error).message}`);
      }
      for (const id of ids) {
        for (const resolve of this.sent.get(id) ?? []) resolve();
        this.sent.delete(id);
      }
    }
    this.sending = false;
  }
}
