import { SqlQueueClosedError } from '../errors.js';
import type { QueueStore } from '../queue-store.js';
import type { EnqueueResult, NewJob } from '../types.js';

/** How concurrent single enqueues share statements (the module's `enqueueBatching` option). */
export interface EnqueueBatchingSettings {
  /** Jobs per statement at most. */
  maxBatchSize: number;
  /** Statements of one queue in flight at once; calls made meanwhile wait and go out together. */
  maxInFlight: number;
  /** Holds a lone call to an idle queue this many microseconds, for company (0: not held). */
  windowUs: number;
}

/** When the batcher's deferred sends run; tests pass a fake clock's timers. */
export interface BatchTimers {
  /** Runs `callback` at the end of this event-loop turn, after the I/O callbacks already due. */
  defer(callback: () => void): void;
  /** Runs `callback` once `microseconds` have passed, unless the returned function cancels it. */
  after(microseconds: number, callback: () => void): () => void;
}

/**
 * Node's timers wake after 1 ms at the earliest, so a window shorter than that is waited by
 * looking at the clock once per event-loop turn: the loop keeps serving I/O (the calls the
 * window waits for arrive that way) and spins only while such a window is open, which the
 * `windowUs` option opts into.
 */
export const systemBatchTimers: BatchTimers = {
  defer: (callback) => void setImmediate(callback),
  after(microseconds, callback) {
    if (microseconds >= 1000) {
      const timer = setTimeout(callback, microseconds / 1000);
      return () => clearTimeout(timer);
    }
    const due = performance.now() + microseconds / 1000;
    let cancelled = false;
    const check = () => {
      if (cancelled) return;
      if (performance.now() >= due) callback();
      else setImmediate(check);
    };
    setImmediate(check);
    return () => (cancelled = true);
  },
};

interface Call {
  job: NewJob;
  resolve(result: EnqueueResult): void;
  reject(error: unknown): void;
}

/** One queue's calls: the store's bulk enqueue takes jobs of one queue (PostgreSQL). */
interface Lane {
  readonly queue: string;
  waiting: Call[];
  inFlight: number;
  /** A send is due at the end of this turn or of the window; calls made until then join it. */
  scheduled: boolean;
  /** Ends the window early (at close), while one is open. */
  cancelWindow: (() => void) | null;
}

/**
 * Group commit for single enqueues made outside a caller's transaction: calls to one queue
 * that arrive while its statements are in flight share the next statement (and its commit),
 * up to `maxBatchSize` jobs. Nothing waits on a timer: a call to an idle queue goes out at the
 * end of the event-loop turn that made it, together with the calls made in that same turn
 * (`Promise.all` over many enqueues, or requests served in one turn). Each caller gets its own
 * result or error, and a queue is woken once per statement, not per job.
 *
 * When a statement of several jobs fails:
 * - with an error the store calls transient (connection lost, timeout, deadlock, failover):
 *   every caller gets that error, as each would have alone. The statement may have committed
 *   with its reply lost, and retrying a job without an idempotency key could store it twice;
 *   the unbatched path never retries either, and only the caller knows whether its job has a
 *   key that makes its own retry safe.
 * - with any other error: the database refused the statement, so nothing of it was stored
 *   (one autocommit statement, or the store's own transaction for grouped jobs). Each job is
 *   enqueued again alone, so one bad job fails only its own caller.
 */
export class EnqueueBatcher {
  private readonly lanes = new Map<string, Lane>();
  private closed = false;
  private closing: Promise<void> | null = null;
  private onIdle: (() => void) | null = null;

  constructor(
    private readonly store: Pick<QueueStore, 'enqueue' | 'isRefusal'>,
    private readonly settings: EnqueueBatchingSettings,
    /** Wakes a queue's readers after a statement created jobs in it. */
    private readonly wake: (queue: string) => void,
    private readonly timers: BatchTimers = systemBatchTimers,
  ) {}

  /** Enqueues one validated job with the calls around it; resolves with this job's own result. */
  enqueue(job: NewJob): Promise<EnqueueResult> {
    if (this.closed) {
      return Promise.reject(
        new SqlQueueClosedError(
          `enqueue to '${job.queue}' refused: the queue module was closed by the application's shutdown; enqueue before it closes`,
        ),
      );
    }
    return new Promise((resolve, reject) => {
      let lane = this.lanes.get(job.queue);
      if (!lane)
        this.lanes.set(
          job.queue,
          (lane = { queue: job.queue, waiting: [], inFlight: 0, scheduled: false, cancelWindow: null }),
        );
      lane.waiting.push({ job, resolve, reject });
      // A full statement's worth has nothing to wait for.
      if (lane.waiting.length >= this.settings.maxBatchSize) this.send(lane);
      else this.schedule(lane);
    });
  }

  /**
   * Refuses new calls and sends what is waiting (windows cut short), for at most `timeoutMs`.
   * Calls still unsent then fail (their jobs were not stored); statements in flight finish or
   * fail on their own.
   */
  close(timeoutMs: number): Promise<void> {
    // A second close waits for the first one's flush rather than returning before it.
    return (this.closing ??= this.flush(timeoutMs));
  }

  private async flush(timeoutMs: number): Promise<void> {
    this.closed = true;
    if (this.lanes.size === 0) return;
    let cancelTimeout = () => {};
    const idle = new Promise<boolean>((resolve) => {
      this.onIdle = () => resolve(true);
      cancelTimeout = this.timers.after(timeoutMs * 1000, () => resolve(false));
    });
    for (const lane of this.lanes.values()) {
      if (lane.cancelWindow) {
        lane.cancelWindow();
        lane.cancelWindow = null;
        lane.scheduled = false;
      }
      this.send(lane);
      // A lane whose window was all that kept it (its calls already sent and answered).
      this.dropIfIdle(lane);
    }
    const drained = await idle;
    cancelTimeout();
    if (drained) return;
    for (const lane of this.lanes.values()) {
      for (const call of lane.waiting.splice(0)) {
        call.reject(
          new SqlQueueClosedError(
            `enqueue to '${lane.queue}' failed: the job was not stored, because shutdown could not send it within ${timeoutMs} ms (database slow or unreachable?)`,
          ),
        );
      }
    }
  }

  private schedule(lane: Lane): void {
    if (lane.scheduled || lane.inFlight >= this.settings.maxInFlight) return;
    lane.scheduled = true;
    const go = () => {
      lane.scheduled = false;
      lane.cancelWindow = null;
      this.send(lane);
      this.dropIfIdle(lane);
    };
    const lone = lane.inFlight === 0 && lane.waiting.length === 1;
    if (lone && this.settings.windowUs > 0 && !this.closed)
      lane.cancelWindow = this.timers.after(this.settings.windowUs, go);
    else this.timers.defer(go);
  }

  private send(lane: Lane): void {
    while (lane.inFlight < this.settings.maxInFlight && lane.waiting.length > 0) {
      const calls = lane.waiting.splice(0, this.settings.maxBatchSize);
      lane.inFlight++;
      void this.run(lane.queue, calls)
        // Whatever goes wrong, every caller is settled (settling one twice is a no-op).
        .catch((error: unknown) => {
          for (const call of calls) call.reject(error);
        })
        .finally(() => {
          lane.inFlight--;
          this.afterStatement(lane);
        });
    }
  }

  private afterStatement(lane: Lane): void {
    // Deferred to the end of the turn: the callers just answered can add their next job.
    if (this.closed) this.send(lane);
    else if (lane.waiting.length > 0) this.schedule(lane);
    this.dropIfIdle(lane);
  }

  /** Forgets a queue with nothing waiting or in flight (queue names may come and go). */
  private dropIfIdle(lane: Lane): void {
    if (lane.waiting.length > 0 || lane.inFlight > 0 || lane.scheduled) return;
    if (this.lanes.get(lane.queue) === lane) this.lanes.delete(lane.queue);
    if (this.lanes.size === 0) this.onIdle?.();
  }

  private async run(queue: string, calls: Call[]): Promise<void> {
    let results: EnqueueResult[];
    try {
      results = await this.store.enqueue(calls.map((call) => call.job));
    } catch (error) {
      // Sent again job by job only when the database refused the statement (it stored nothing):
      // after an unknown outcome (connection lost, client-side timeout) it may have committed.
      if (calls.length === 1 || !this.store.isRefusal(error)) {
        for (const call of calls) call.reject(error);
        return;
      }
      await this.runAlone(queue, calls);
      return;
    }
    calls.forEach((call, index) => call.resolve(results[index]!));
    if (results.some((result) => result.created)) this.wakeReaders(queue);
  }

  /**
   * After a refused statement: each job in its own statement, concurrently as unbatched calls
   * would, except that the jobs of one ordered group go one after another, so their ids keep
   * the order the batch would have given them.
   */
  private async runAlone(queue: string, calls: Call[]): Promise<void> {
    const groupTails = new Map<string, Promise<EnqueueResult[]>>();
    const outcomes = await Promise.allSettled(
      calls.map((call) => {
        const alone = async () => this.store.enqueue([call.job]);
        const group = call.job.groupKey;
        const before = group === null ? undefined : groupTails.get(group);
        const attempt = before ? before.then(alone, alone) : alone();
        if (group !== null) groupTails.set(group, attempt);
        return attempt;
      }),
    );
    outcomes.forEach((outcome, index) => {
      if (outcome.status === 'fulfilled') calls[index]!.resolve(outcome.value[0]!);
      else calls[index]!.reject(outcome.reason);
    });
    if (outcomes.some((outcome) => outcome.status === 'fulfilled' && outcome.value[0]!.created)) {
      this.wakeReaders(queue);
    }
  }

  /**
   * A wake-up is a hint (readers also poll): one that throws must not turn stored jobs into
   * errors, which their callers would retry into duplicates.
   */
  private wakeReaders(queue: string): void {
    try {
      this.wake(queue);
    } catch {
      // The jobs are stored; readers find them at their next poll.
    }
  }
}
