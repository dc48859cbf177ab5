import { describe, expect, it } from 'vitest';
import { EnqueueBatcher, type BatchTimers } from '../../lib/src/core/producer/enqueue-batcher.js';
import { SqlQueueClosedError } from '../../lib/src/core/errors.js';
import { SqlQueueValidationError } from '../../lib/src/core/errors.js';
import { QueueProducerCore } from '../../lib/src/core/producer/producer.js';
import type { QueueStore } from '../../lib/src/core/queue-store.js';
import type { EnqueueResult, NewJob } from '../../lib/src/core/types.js';
import { prepareJob } from '../../lib/src/core/producer/job-validation.js';
import { WakeBus } from '../../lib/src/core/wake.js';
import { FakeClock, settle } from '../helpers/fake-clock.js';
import { deferred } from '../helpers/wait-for.js';

const LIMITS = { maxPayloadBytes: 1024, defaultMaxAttempts: 3 };
const SETTINGS = { maxBatchSize: 500, maxInFlight: 2, windowUs: 0 };

function job(queue: string, n: number, idempotencyKey?: string): NewJob {
  return prepareJob(queue, { n }, idempotencyKey === undefined ? {} : { idempotencyKey }, LIMITS);
}

function groupJob(queue: string, n: number, groupKey: string): NewJob {
  return prepareJob(queue, { n }, { groupKey }, LIMITS);
}

class Transient extends Error {}

/**
 * A store whose statements answer only when the test says so. Each statement's answer is
 * computed from its jobs when answered: ids from one sequence, an idempotency key that was seen
 * before (in this statement or an earlier one) gives that job's id with created false, and a
 * payload `{ "n": -1 }` makes the statement fail as the database would refuse it.
 */
function heldStore() {
  const statements: { jobs: NewJob[]; transaction: unknown; answer: () => void }[] = [];
  const keys = new Map<string, string>();
  let nextId = 1;
  const answer = (jobs: readonly NewJob[]): EnqueueResult[] => {
    if (jobs.some((j) => j.payload === '{"n":-1}')) throw new Error('new row violates check constraint "no_poison"');
    return jobs.map((j) => {
      const key = j.idempotencyKey === null ? null : `${j.queue}/${j.idempotencyKey}`;
      const existing = key === null ? undefined : keys.get(key);
      if (existing) return { jobId: existing, created: false };
      const jobId = String(nextId++);
      if (key !== null) keys.set(key, jobId);
      return { jobId, created: true };
    });
  };
  let failNext: unknown = null;
  const store = {
    enqueue(jobs: readonly NewJob[], transaction?: unknown): Promise<EnqueueResult[]> {
      const result = deferred<EnqueueResult[]>();
      const failure = failNext;
      failNext = null;
      statements.push({
        jobs: [...jobs],
        transaction,
        answer: () => {
          if (failure) return result.reject(failure);
          try {
            result.resolve(answer(jobs));
          } catch (error) {
            result.reject(error);
          }
        },
      });
      return result.promise;
    },
    // What the database answered with an error is a refusal; a Transient stands for a lost
    // connection or a client-side timeout, whose statement may have committed.
    isRefusal: (error: unknown) => !(error instanceof Transient),
  };
  return {
    store,
    statements,
    /** The next statement fails with this error, whatever its jobs. */
    failNextWith(error: unknown) {
      failNext = error;
    },
    /** Answers every statement sent so far that has not answered, then lets callers run. */
    async answerAll(): Promise<void> {
      for (const statement of statements.splice(0)) statement.answer();
      await settle();
    },
    /** Sizes of the statements waiting for an answer. */
    sizes: () => statements.map((s) => s.jobs.length),
  };
}

/** The batcher's timers on a fake clock; "end of the turn" is a real setImmediate (settle runs it). */
function fakeTimers(clock: FakeClock): BatchTimers {
  return {
    defer: (callback) => void setImmediate(callback),
    after(microseconds, callback) {
      const cancel = new AbortController();
      void clock.sleep(microseconds / 1000, cancel.signal).then(() => cancel.signal.aborted || callback());
      return () => cancel.abort();
    },
  };
}

function batcher(db: ReturnType<typeof heldStore>, settings = SETTINGS, clock = new FakeClock()) {
  const woken: string[] = [];
  const b = new EnqueueBatcher(db.store, settings, (queue) => woken.push(queue), fakeTimers(clock));
  return { batcher: b, woken, clock };
}

/** Outcomes of calls, as they settle: a result or the error. */
function track<T>(promises: Promise<T>[]): (T | Error | undefined)[] {
  const outcomes: (T | Error | undefined)[] = promises.map(() => undefined);
  promises.forEach((p, i) =>
    p.then(
      (value) => (outcomes[i] = value),
      (error: Error) => (outcomes[i] = error),
    ),
  );
  return outcomes;
}

describe('EnqueueBatcher', () => {
  it('sends a lone call at the end of its turn, with no timer, and the calls of one turn as one statement', async () => {
    const db = heldStore();
    const { batcher: b, woken } = batcher(db);
    const lone = track([b.enqueue(job('emails', 0))]);
    expect(db.sizes()).toEqual([]);
    await settle();
    // No clock advance was needed: nothing waited on a timer.
    expect(db.sizes()).toEqual([1]);
    await db.answerAll();
    expect(lone).toEqual([{ jobId: '1', created: true }]);
    expect(woken).toEqual(['emails']);

    const many = track(Array.from({ length: 40 }, (_, n) => b.enqueue(job('emails', n))));
    await settle();
    expect(db.sizes()).toEqual([40]);
    // Each caller gets the result of its own job: ids follow the statement's input order.
    expect(db.statements[0]!.jobs.map((j) => JSON.parse(j.payload).n)).toEqual(Array.from({ length: 40 }, (_, n) => n));
    await db.answerAll();
    expect(many.map((r) => (r as EnqueueResult).jobId)).toEqual(Array.from({ length: 40 }, (_, n) => String(n + 2)));
    // One wake-up per statement, not per job.
    expect(woken).toEqual(['emails', 'emails']);
  });

  it('calls made while maxInFlight statements travel go out together when one returns, maxBatchSize at most', async () => {
    const db = heldStore();
    const { batcher: b } = batcher(db, { maxBatchSize: 10, maxInFlight: 2, windowUs: 0 });
    const first = track([b.enqueue(job('q', 1))]);
    await settle();
    const second = track([b.enqueue(job('q', 2))]);
    await settle();
    expect(db.sizes()).toEqual([1, 1]);

    // Both slots taken: these wait, however many turns pass.
    const waiting = track(Array.from({ length: 25 }, (_, n) => b.enqueue(job('q', 100 + n))));
    await settle();
    expect(db.sizes()).toEqual([1, 1]);
    expect(waiting.every((o) => o === undefined)).toBe(true);

    // One answer frees one slot: the next maxBatchSize calls take it.
    db.statements.shift()!.answer();
    await settle();
    expect(first).toEqual([{ jobId: '1', created: true }]);
    expect(second).toEqual([undefined]);
    expect(db.sizes()).toEqual([1, 10]);
    await db.answerAll();
    expect(db.sizes()).toEqual([10, 5]);
    await db.answerAll();
    expect(waiting.every((o) => (o as EnqueueResult).created)).toBe(true);
    expect(new Set(waiting.map((o) => (o as EnqueueResult).jobId)).size).toBe(25);
  });

  it('keeps queues apart: one statement per queue, each woken once', async () => {
    const db = heldStore();
    const { batcher: b, woken } = batcher(db);
    track([b.enqueue(job('a', 1)), b.enqueue(job('b', 2)), b.enqueue(job('a', 3))]);
    await settle();
    expect(db.statements.map((s) => s.jobs.map((j) => j.queue))).toEqual([['a', 'a'], ['b']]);
    await db.answerAll();
    expect(woken.sort()).toEqual(['a', 'b']);
  });

  it('gives callers of one idempotency key the same job, created for exactly one, and wakes nobody for none created', async () => {
    const db = heldStore();
    const { batcher: b, woken } = batcher(db);
    const outcomes = track([
      b.enqueue(job('q', 1, 'order-1')),
      b.enqueue(job('q', 2, 'order-2')),
      b.enqueue(job('q', 3, 'order-1')),
    ]);
    await settle();
    await db.answerAll();
    expect(outcomes).toEqual([
      { jobId: '1', created: true },
      { jobId: '2', created: true },
      { jobId: '1', created: false },
    ]);
    woken.length = 0;
    const again = track([b.enqueue(job('q', 4, 'order-1'))]);
    await settle();
    await db.answerAll();
    expect(again).toEqual([{ jobId: '1', created: false }]);
    expect(woken).toEqual([]);
  });

  it('a refused statement is retried job by job: the bad job fails its own caller only', async () => {
    const db = heldStore();
    const { batcher: b, woken } = batcher(db);
    const outcomes = track([b.enqueue(job('q', 1)), b.enqueue(job('q', -1)), b.enqueue(job('q', 3))]);
    await settle();
    expect(db.sizes()).toEqual([3]);
    await db.answerAll();
    expect(db.sizes()).toEqual([1, 1, 1]);
    await db.answerAll();
    expect(outcomes[0]).toEqual({ jobId: '1', created: true });
    expect(outcomes[1]).toBeInstanceOf(Error);
    expect((outcomes[1] as Error).message).toContain('no_poison');
    expect(outcomes[2]).toEqual({ jobId: '2', created: true });
    expect(woken).toEqual(['q']);
  });

  it('jobs of one ordered group retried after a refusal go one after another, keeping their order', async () => {
    const db = heldStore();
    const { batcher: b } = batcher(db);
    const outcomes = track([
      b.enqueue(groupJob('q', 1, 'order-7')),
      b.enqueue(job('q', -1)),
      b.enqueue(groupJob('q', 2, 'order-7')),
      b.enqueue(job('q', 3)),
    ]);
    await settle();
    await db.answerAll();
    // The group's second job waits for its first: answered in any order, ids could not swap.
    expect(db.statements.map((s) => JSON.parse(s.jobs[0]!.payload).n)).toEqual([1, -1, 3]);
    db.statements.splice(1).forEach((statement) => statement.answer());
    await settle();
    expect(db.sizes()).toEqual([1]);
    await db.answerAll();
    expect(db.statements.map((s) => JSON.parse(s.jobs[0]!.payload).n)).toEqual([2]);
    await db.answerAll();
    expect(outcomes[1]).toBeInstanceOf(Error);
    const [first, , second] = outcomes as EnqueueResult[];
    expect(Number(first!.jobId)).toBeLessThan(Number(second!.jobId));
  });

  it('a wake-up that throws leaves every caller with its result', async () => {
    const db = heldStore();
    const b = new EnqueueBatcher(
      db.store,
      SETTINGS,
      () => {
        throw new Error('a reader crashed');
      },
      fakeTimers(new FakeClock()),
    );
    const outcomes = track([b.enqueue(job('q', 1)), b.enqueue(job('q', 2))]);
    await settle();
    await db.answerAll();
    // Stored jobs reported as errors would be retried by their callers into duplicates.
    expect(outcomes).toEqual([
      { jobId: '1', created: true },
      { jobId: '2', created: true },
    ]);
    const alone = track([b.enqueue(job('q', 3)), b.enqueue(job('q', -1))]);
    await settle();
    await db.answerAll();
    await db.answerAll();
    expect(alone[0]).toEqual({ jobId: '3', created: true });
    expect((alone[1] as Error).message).toContain('no_poison');
  });

  it('settles every caller even when judging a failure goes wrong', async () => {
    const db = heldStore();
    const broken = new Error('isRefusal crashed');
    const store = {
      ...db.store,
      isRefusal: () => {
        throw broken;
      },
    };
    const b = new EnqueueBatcher(store, SETTINGS, () => {}, fakeTimers(new FakeClock()));
    db.failNextWith(new Error('refused'));
    const outcomes = track([b.enqueue(job('q', 1)), b.enqueue(job('q', 2))]);
    await settle();
    await db.answerAll();
    expect(outcomes).toEqual([broken, broken]);
  });

  it('a failure of unknown outcome reaches every caller of the statement, never resent (the statement may have committed)', async () => {
    const db = heldStore();
    const { batcher: b, woken } = batcher(db);
    const lost = new Transient('Connection terminated unexpectedly');
    db.failNextWith(lost);
    const outcomes = track([b.enqueue(job('q', 1)), b.enqueue(job('q', 2))]);
    await settle();
    await db.answerAll();
    expect(outcomes).toEqual([lost, lost]);
    expect(db.statements).toEqual([]);
    expect(woken).toEqual([]);

    // A lone job is not retried either, whatever the error: as without batching.
    db.failNextWith(new Error('permission denied for table jobs'));
    const alone = track([b.enqueue(job('q', 3))]);
    await settle();
    await db.answerAll();
    expect((alone[0] as Error).message).toBe('permission denied for table jobs');
    expect(db.statements).toEqual([]);
  });

  it('windowUs holds a lone call to an idle queue for company; a queue already busy is not held', async () => {
    const db = heldStore();
    const clock = new FakeClock();
    const { batcher: b } = batcher(db, { ...SETTINGS, windowUs: 300 }, clock);
    track([b.enqueue(job('q', 1))]);
    await settle();
    expect(db.sizes()).toEqual([]);
    await clock.advance(0.2);
    track([b.enqueue(job('q', 2)), b.enqueue(job('q', 3))]);
    await settle();
    expect(db.sizes()).toEqual([]);
    await clock.advance(0.1);
    expect(db.sizes()).toEqual([3]);

    // One statement travels: the next call goes at the end of its turn, the window not waited.
    track([b.enqueue(job('q', 4))]);
    await settle();
    expect(db.sizes()).toEqual([3, 1]);
    await db.answerAll();
  });

  it('close cuts a window short, then refuses new calls', async () => {
    const db = heldStore();
    const { batcher: b } = batcher(db, { ...SETTINGS, windowUs: 500 });
    const outcome = track([b.enqueue(job('q', 1))]);
    const closing = b.close(5_000);
    // Sent within close itself: no window, no end of turn.
    expect(db.sizes()).toEqual([1]);
    await db.answerAll();
    await closing;
    expect(outcome).toEqual([{ jobId: '1', created: true }]);

    const late = b.enqueue(job('q', 9));
    await expect(late).rejects.toThrow(SqlQueueClosedError);
    await expect(late).rejects.toThrow(
      "enqueue to 'q' refused: the queue module was closed by the application's shutdown; enqueue before it closes",
    );
  });

  it('close returns at once when an open window is all a queue has left', async () => {
    const db = heldStore();
    const clock = new FakeClock();
    const { batcher: b } = batcher(db, { maxBatchSize: 2, maxInFlight: 2, windowUs: 500 }, clock);
    // The first call opens a window; the second fills the statement, which goes out at once.
    const outcomes = track([b.enqueue(job('q', 1)), b.enqueue(job('q', 2))]);
    expect(db.sizes()).toEqual([2]);
    await db.answerAll();
    expect(outcomes.every((o) => (o as EnqueueResult).created)).toBe(true);
    let closed = false;
    void b.close(5_000).then(() => (closed = true));
    await settle();
    expect(closed).toBe(true);
  });

  it('a second close waits for the first one to finish sending', async () => {
    const db = heldStore();
    const { batcher: b } = batcher(db);
    track([b.enqueue(job('q', 1))]);
    const done: string[] = [];
    void b.close(5_000).then(() => done.push('first'));
    void b.close(5_000).then(() => done.push('second'));
    await settle();
    expect(done).toEqual([]);
    await db.answerAll();
    expect(done).toEqual(['first', 'second']);
  });

  it('close sends everything waiting, maxInFlight statements at a time, and returns once all answered', async () => {
    const db = heldStore();
    const { batcher: b } = batcher(db, { maxBatchSize: 10, maxInFlight: 1, windowUs: 0 });
    const outcomes = track(Array.from({ length: 25 }, (_, n) => b.enqueue(job('q', n))));
    let closed = false;
    void b.close(5_000).then(() => (closed = true));
    expect(db.sizes()).toEqual([10]);
    await db.answerAll();
    expect(db.sizes()).toEqual([10]);
    await db.answerAll();
    expect(db.sizes()).toEqual([5]);
    expect(closed).toBe(false);
    await db.answerAll();
    expect(closed).toBe(true);
    expect(outcomes.map((o) => (o as EnqueueResult).jobId)).toEqual(
      Array.from({ length: 25 }, (_, n) => String(n + 1)),
    );
  });

  it('close gives up after its bound: calls never sent fail, saying their jobs were not stored', async () => {
    const db = heldStore();
    const clock = new FakeClock();
    const { batcher: b } = batcher(db, { maxBatchSize: 1, maxInFlight: 1, windowUs: 0 }, clock);
    const outcomes = track([b.enqueue(job('q', 1)), b.enqueue(job('q', 2))]);
    const closing = b.close(1_000);
    // The database does not answer the first statement.
    await clock.advance(999);
    expect(outcomes).toEqual([undefined, undefined]);
    await clock.advance(1);
    await closing;
    expect(outcomes[0]).toBeUndefined();
    expect(outcomes[1]).toBeInstanceOf(SqlQueueClosedError);
    expect((outcomes[1] as Error).message).toBe(
      "enqueue to 'q' failed: the job was not stored, because shutdown could not send it within 1000 ms (database slow or unreachable?)",
    );
    expect(db.sizes()).toEqual([1]);
    // The statement in flight still gives its caller the answer.
    await db.answerAll();
    expect(outcomes[0]).toEqual({ jobId: '1', created: true });
  });
});

describe('QueueProducerCore with batching', () => {
  function producer(db: ReturnType<typeof heldStore>) {
    return new QueueProducerCore(
      db.store as unknown as QueueStore,
      { maxPayloadBytes: 1024, maxAttemptsFor: () => 3, enqueueBatching: { enabled: true, ...SETTINGS } },
      new WakeBus(),
      null,
    );
  }

  it("never batches a call in the caller's transaction, and validates each call before anything is queued", async () => {
    const db = heldStore();
    const p = producer(db);
    const transaction = { caller: 'tx' };
    const outcomes = track([
      p.enqueue('q', { n: 1 }),
      p.enqueue('q', { n: 2 }, { transaction }),
      p.enqueue('q', { n: 3 }, { delay: 5 } as never),
      p.enqueue('q', { n: 4 }),
    ]);
    // The caller's transaction went straight to the store, in the caller's own turn.
    expect(db.statements.map((s) => [s.jobs.length, s.transaction])).toEqual([[1, transaction]]);
    await settle();
    expect(outcomes[2]).toBeInstanceOf(SqlQueueValidationError);
    expect(db.statements.map((s) => [s.jobs.map((j) => JSON.parse(j.payload).n), s.transaction])).toEqual([
      [[2], transaction],
      [[1, 4], undefined],
    ]);
    await db.answerAll();
    expect(outcomes[0]).toEqual({ jobId: '2', created: true });
    expect(outcomes[1]).toEqual({ jobId: '1', created: true });
    expect(outcomes[3]).toEqual({ jobId: '3', created: true });
  });
});
