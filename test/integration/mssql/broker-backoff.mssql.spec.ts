/**
 * A broker message waiting for its retry holds no handler (review 2, R2-5; issue 21), on both
 * databases. Before issue 21 a failed message was rolled back to a savepoint and slept on by the
 * reader that held its conversation group, and GET CONVERSATION GROUP returned that group again:
 * with as many conversations in backoff as readers, the others waited out the backoff. Now the
 * retry is the table queue's: the job waits as 'delayed', holding its ordered group (so its
 * conversation stays in order) but no reader, and another conversation's message runs at once.
 */
import { expect, it } from 'vitest';
import { waitFor } from '../../helpers/wait-for.js';
import { brokerSuite, CallLog } from './broker-harness.js';
import { describeEachMssqlDatabase } from './mssql-databases.js';

interface Keyed {
  key: string;
  n: number;
}

/** The review's bound: before issue 21 this took about the whole backoff (30 s). */
const PROMPTLY_MS = 2_000;
const BACKOFF_MS = 30_000;

describeEachMssqlDatabase('Service Broker: a message in backoff pins no reader', (db) => {
  const suite = brokerSuite(db, 'brkbof');

  it('maxReaders 1, backoff fixed 30 s: message A fails once; message B of another conversation is handled within 2 s while A waits for its retry', async () => {
    const name = 'backoff';
    const log = new CallLog<Keyed>();
    const failures: { key: string; attempt: number }[] = [];
    const app = await suite.boot({
      queues: {
        [name]: { minReaders: 1, maxReaders: 1, maxAttempts: 3, backoff: { type: 'fixed', delayMs: BACKOFF_MS } },
      },
      handlers: {
        [name]: log.handler(async (body, context) => {
          if (body.key === 'a' && context.attempt === 1) {
            failures.push({ key: body.key, attempt: context.attempt });
            throw new Error('A fails once');
          }
        }),
      },
    });

    await app.producer.send(name, { key: 'a', n: 1 }, { groupKey: 'a' });
    const [failed] = await waitFor(
      () => app.events.of('failed', name),
      (events) => events.length === 1,
      { what: "message A's first attempt failing" },
    );
    expect(failed).toMatchObject({ attempt: 1, dead: false });
    const jobA = String(failed!.jobId);

    const sentAt = Date.now();
    await app.producer.send(name, { key: 'b', n: 1 }, { groupKey: 'b' });
    await waitFor(
      () => log.calls.find((c) => c.body.key === 'b'),
      (call) => call !== undefined,
      { timeoutMs: BACKOFF_MS, what: 'message B' },
    );
    const b = log.calls.find((c) => c.body.key === 'b')!;
    expect(
      b.startedAt - sentAt,
      'B started this many ms after its send (review 2, R2-5: about 30 s before)',
    ).toBeLessThan(PROMPTLY_MS);

    // A still waits for its retry: delayed in the table queue, its run 30 s away, no reader busy.
    expect(
      log.calls.filter((c) => c.body.key === 'a'),
      'A has not run again',
    ).toEqual([]);
    expect(failures).toEqual([{ key: 'a', attempt: 1 }]);
    const a = await app.producer.getJob(jobA);
    expect(a).toMatchObject({ state: 'delayed', attempts: 1 });
    // RunAt is the database's clock; the margin covers a client clock a few seconds off.
    expect(a!.runAt.getTime() - Date.now(), "A's retry is due in about 30 s").toBeGreaterThan(BACKOFF_MS / 2);
    await waitFor(
      () => app.consumer().queues.find((q) => q.queue === name),
      (q) => q?.running === 0,
      { what: 'no handler running once B is done' },
    );
  });
});
