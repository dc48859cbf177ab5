import { describe, expect, it } from 'vitest';
import { silentLogger } from '../../lib/src/core/logger.js';
import { RemoteWaker } from '../../lib/src/core/wake.js';
import { FakeClock, settle } from '../helpers/fake-clock.js';
import { deferred } from '../helpers/wait-for.js';

/** A store whose NOTIFYs answer only when the test says so. */
function notifyingStore() {
  const sent: { queue: string; sentAt: number; answer: ReturnType<typeof deferred<void>> }[] = [];
  return {
    sent,
    store: (clock: FakeClock) => ({
      notify(queue: string) {
        const answer = deferred<void>();
        sent.push({ queue, sentAt: clock.now(), answer });
        return answer.promise;
      },
    }),
    /** Lets every notification sent so far answer. */
    async answerAll(): Promise<void> {
      for (const s of sent) s.answer.resolve();
      await settle();
    },
  };
}

describe('RemoteWaker', () => {
  it('sends a lone request at once, and one more for all requests made while it was on its way', async () => {
    const clock = new FakeClock();
    const db = notifyingStore();
    const waker = new RemoteWaker(db.store(clock), 0, silentLogger, clock);
    waker.request('emails');
    expect(db.sent.map((s) => s.queue)).toEqual(['emails']);

    // Jobs committed while that NOTIFY travels may be missed by the claim it causes: one more follows.
    for (let i = 0; i < 50; i++) waker.request('emails');
    expect(db.sent).toHaveLength(1);
    await db.answerAll();
    expect(db.sent).toHaveLength(2);
    await db.answerAll();
    expect(db.sent).toHaveLength(2);

    // Another queue is not held up by this one.
    waker.request('emails');
    waker.request('sms');
    expect(db.sent.map((s) => s.queue)).toEqual(['emails', 'emails', 'emails', 'sms']);
    waker.close();
  });

  it('keeps intervalMs between notifications of a queue; requests while one waits ride on it', async () => {
    const clock = new FakeClock();
    const db = notifyingStore();
    const waker = new RemoteWaker(db.store(clock), 100, silentLogger, clock);
    waker.request('emails');
    await db.answerAll();
    await clock.advance(10);
    waker.request('emails');
    waker.request('emails');
    expect(db.sent).toHaveLength(1);
    await clock.advance(89);
    expect(db.sent).toHaveLength(1);
    await clock.advance(1);
    expect(db.sent.map((s) => s.sentAt)).toEqual([0, 100]);
    await db.answerAll();
    // After the spacing has passed, a request goes at once again.
    await clock.advance(500);
    waker.request('emails');
    expect(db.sent.map((s) => s.sentAt)).toEqual([0, 100, 600]);
    waker.close();
  });

  it('logs a failed notification at debug level and goes on with the next', async () => {
    const clock = new FakeClock();
    const debug: string[] = [];
    let calls = 0;
    const waker = new RemoteWaker(
      {
        notify: async () => {
          if (++calls === 1) throw new Error('connection reset');
        },
      },
      0,
      { ...silentLogger, debug: (message: string) => debug.push(message) },
      clock,
    );
    waker.request('emails');
    await settle();
    waker.request('emails');
    await settle();
    expect(calls).toBe(2);
    expect(debug).toEqual([`wake-up notification for queue 'emails' failed: connection reset`]);
    waker.close();
  });

  it('sends nothing more once closed, including a notification waiting for its spacing', async () => {
    const clock = new FakeClock();
    const db = notifyingStore();
    const waker = new RemoteWaker(db.store(clock), 100, silentLogger, clock);
    waker.request('emails');
    waker.request('emails');
    await db.answerAll();
    expect(db.sent).toHaveLength(1);
    waker.close();
    await clock.advance(1_000);
    waker.request('emails');
    await db.answerAll();
    expect(db.sent).toHaveLength(1);
  });
});
