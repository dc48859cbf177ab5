import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type sql from 'mssql';
import type { QueueStore } from '../../lib/src/core/queue-store.js';
import type { JobRecord as JobRecordLike } from '../../lib/src/core/types.js';
import { prepareJob } from '../../lib/src/core/producer/job-validation.js';
import { uniqueSchema } from '../helpers/databases.js';
import type { StoreTarget } from './store-contract.js';

const LIMITS = { maxPayloadBytes: 1024, defaultMaxAttempts: 3 };

/**
 * A transactional handler's transaction on a store (issue 25): the handler's writes (here a
 * follow-up job enqueued through `handle`, a write every dialect takes in a caller's transaction)
 * and the job's completion commit together, roll back together, and a completion with a stale
 * token is refused inside it.
 */
export function describeHandlerTransactionContract(target: StoreTarget): void {
  describe(`handler transaction contract: ${target.name}`, () => {
    const schema = uniqueSchema(`htx${target.name.replace(/\W/g, '').toLowerCase()}`);
    let store: QueueStore;
    let seq = 0;

    beforeAll(async () => {
      store = await target.openStore(schema, { poolSize: 4 });
      await store.migrate('auto');
    });
    afterAll(async () => {
      await store?.close();
      await target.dropSchema(schema);
    });

    async function claimOne(): Promise<{ queue: string; id: string; claimToken: string }> {
      const queue = `htx.${++seq}`;
      await store.enqueue([prepareJob(queue, { n: 1 }, {}, LIMITS)]);
      const [claimed] = await store.claim({ queue, limit: 1, leaseMs: 30_000, workerId: 'htx' });
      return { queue, id: claimed!.id, claimToken: claimed!.claimToken };
    }

    const followUp = (queue: string) => prepareJob(`${queue}.next`, { after: true }, {}, LIMITS);

    it('the writes and the completion commit together', async () => {
      const job = await claimOne();
      const transaction = await store.beginHandlerTransaction!();
      const [next] = await store.enqueue([followUp(job.queue)], transaction.handle);
      expect(await transaction.complete({ id: job.id, claimToken: job.claimToken, result: '{"ok":1}' })).toEqual({
        id: job.id,
        outcome: 'ok',
      });
      await transaction.commit();
      expect(await store.getJob(job.id)).toMatchObject({ state: 'done', result: { ok: 1 } });
      expect(await store.getJob(next!.jobId)).toMatchObject({ state: 'ready', queue: `${job.queue}.next` });
    });

    it('a rollback leaves neither: the job still leased to its owner, no follow-up', async () => {
      const job = await claimOne();
      const transaction = await store.beginHandlerTransaction!();
      const [next] = await store.enqueue([followUp(job.queue)], transaction.handle);
      expect((await transaction.complete({ id: job.id, claimToken: job.claimToken })).outcome).toBe('ok');
      await transaction.rollback();
      expect(await store.getJob(job.id)).toMatchObject({ state: 'leased', claimToken: job.claimToken });
      expect(await store.getJob(next!.jobId)).toBeNull();
      // The owner can still complete it the ordinary way.
      expect(await store.complete([{ id: job.id, claimToken: job.claimToken }])).toEqual([
        { id: job.id, outcome: 'ok' },
      ]);
    });

    it('a stale token is refused inside the transaction, which the caller then rolls back', async () => {
      const job = await claimOne();
      const transaction = await store.beginHandlerTransaction!();
      await store.enqueue([followUp(job.queue)], transaction.handle);
      const stale = '00000000-0000-4000-8000-000000000000';
      expect(await transaction.complete({ id: job.id, claimToken: stale })).toEqual({ id: job.id, outcome: 'lost' });
      await transaction.rollback();
      expect((await store.stats(`${job.queue}.next`)).ready).toBe(0);
      expect(await store.getJob(job.id)).toMatchObject({ state: 'leased' });
    });

    /** A statement of the handler's own through its handle, in each driver's way. */
    function statementOn(handle: unknown, text: { postgres: string; mssql: string }): Promise<unknown> {
      if (store.dialect === 'mssql') return (handle as sql.Transaction).request().query(text.mssql);
      return (handle as { query(text: string): Promise<unknown> }).query(text.postgres);
    }

    it("the handle refuses the handler's statements once its transaction ended (its connection is back in the pool)", async () => {
      const job = await claimOne();
      const transaction = await store.beginHandlerTransaction!();
      await transaction.complete({ id: job.id, claimToken: job.claimToken });
      await transaction.commit();
      const late = `${job.queue}.late`;
      // Were it run, it would commit on its own, outside any transaction of the job.
      await expect(statementOn(transaction.handle, { postgres: 'SELECT 1', mssql: 'SELECT 1' })).rejects.toThrow();
      await expect(store.enqueue([prepareJob(late, {}, {}, LIMITS)], transaction.handle)).rejects.toThrow();
      expect((await store.stats(late)).ready).toBe(0);
    });

    it('readBack waits for a transaction still holding the row, then reads what it committed', async () => {
      const job = await claimOne();
      const transaction = await store.beginHandlerTransaction!();
      await transaction.complete({ id: job.id, claimToken: job.claimToken, result: '{"n":2}' });
      let read: JobRecordLike | null | undefined;
      const reading = transaction.readBack(job.id).then((row) => (read = row));
      await new Promise((resolve) => setTimeout(resolve, 300));
      expect(read).toBeUndefined(); // a plain read would have answered 'leased' by now
      await transaction.commit();
      await reading;
      expect(read).toMatchObject({ state: 'done', claimToken: job.claimToken, result: { n: 2 } });
    });

    it.runIf(target.name.startsWith('mssql'))(
      "a rollback while the handler's request still runs (an abandoned handler) ends it and frees the connection",
      async () => {
        const job = await claimOne();
        const transaction = await store.beginHandlerTransaction!();
        const sleeping = statementOn(transaction.handle, { postgres: '', mssql: "WAITFOR DELAY '00:00:20'" });
        sleeping.catch(() => undefined);
        await new Promise((resolve) => setTimeout(resolve, 200));
        const startedAt = Date.now();
        await transaction.rollback();
        expect(Date.now() - startedAt).toBeLessThan(10_000);
        await expect(sleeping).rejects.toThrow();
        // The job is still its owner's, and the pool still serves every connection it has.
        expect(await store.getJob(job.id)).toMatchObject({ state: 'leased' });
        await Promise.all(Array.from({ length: 4 }, () => store.stats(job.queue)));
      },
    );

    it('a rollback after a failed statement, and a second rollback, do not throw', async () => {
      const transaction = await store.beginHandlerTransaction!();
      // A statement the database refuses (PostgreSQL parses the payload as jsonb; SQL Server keeps text).
      const broken = {
        ...followUp('x'),
        payload: store.dialect === 'postgres' ? 'not json {' : '{}',
        priority: 2 ** 40,
      };
      await expect(store.enqueue([broken], transaction.handle)).rejects.toThrow();
      await transaction.rollback();
      await transaction.rollback();
    });
  });
}
