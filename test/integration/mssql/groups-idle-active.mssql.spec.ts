/**
 * The idle → active race of ordered groups on SQL Server (issue 11; research A (ii) 6), on both
 * databases: one session completes the last job of a group while another enqueues a job into it
 * in a transaction that commits or rolls back at random. The SQL Server protocol (research A.2):
 * the producer inserts, then reads and updates the group row with a locking read
 * (READCOMMITTEDLOCK); the completer locks the row first, then finds the next head with a dirty
 * read; a claim that finds the head missing recomputes it. After every iteration:
 * - a committed job is claimed (at once, or after a claim's short pause on a stale head);
 * - a rolled-back one leaves no group state once a claim has passed;
 * - the cached state agrees with the jobs (design (a)'s predicate), and no deadlock or lock
 *   timeout reached the producer or the completer.
 * At the end the repair sweep finds nothing: normal operation never needs it.
 */
import sql from 'mssql';
import { afterAll, beforeAll, expect, it } from 'vitest';
import type { QueueStore } from '../../../lib/src/core/queue-store.js';
import type { ClaimedJob, NewJob } from '../../../lib/src/core/types.js';
import { prepareJob } from '../../../lib/src/core/producer/job-validation.js';
import { createMssqlStore } from '../../../lib/src/store/mssql/mssql.connect.js';
import { mssqlRows, openMssqlPool, withErrorNumber } from '../../helpers/mssql.js';
import { groupDisagreements, groupRow } from '../../helpers/mssql-test-queries.js';
import { waitFor } from '../../helpers/wait-for.js';
import { describeEachMssqlDatabase, useMssqlSchema } from './mssql-databases.js';

const ITERATIONS = 1_000;
const WORKER = 'idle-active';

const grouped = (queue: string, groupKey: string, n: number): NewJob =>
  prepareJob(queue, { n }, { groupKey }, { maxPayloadBytes: 1024, defaultMaxAttempts: 3 });
const owned = (jobs: readonly ClaimedJob[]) => jobs.map(({ id, claimToken }) => ({ id, claimToken }));

/** A reproducible coin (a linear congruential generator), so a failing iteration can be replayed. */
function coin(seed: number): () => boolean {
  let state = seed >>> 0;
  return () => {
    state = (Math.imul(state, 1664525) + 1013904223) >>> 0;
    return (state & 0x10000) !== 0;
  };
}

describeEachMssqlDatabase('the idle → active race of a group', (db) => {
  const { schema, store, newQueue } = useMssqlSchema(db, 'grpidle', 2);
  let completer: QueueStore;
  let producerPool: sql.ConnectionPool;

  beforeAll(async () => {
    // The completion and the producer's transaction run on sessions of their own.
    completer = createMssqlStore({ url: db.url, poolSize: 1 }, { schema });
    producerPool = await openMssqlPool(db.url, 1);
  });
  afterAll(async () => {
    await completer?.close();
    await producerPool?.close();
  });

  const claim = (queue: string) =>
    store.claim({ queue, limit: 10, groupBatchSize: 1, leaseMs: 60_000, workerId: WORKER });

  it(`${ITERATIONS} iterations of "complete the last job" against "enqueue into the group, commit or roll back"`, async () => {
    const queue = newQueue('race');
    const commits = coin(11);
    const producerFirst = coin(23);
    let committed = 0;
    for (let i = 0; i < ITERATIONS; i++) {
      const key = `g${i}`;
      const last = (await store.enqueue([grouped(queue, key, 1)]))[0]!.jobId;
      const [running] = await claim(queue);
      expect(running?.id, `iteration ${i}: the group's only job`).toBe(last);

      const commit = commits();
      const transaction = new sql.Transaction(producerPool);
      await transaction.begin(sql.ISOLATION_LEVEL.READ_COMMITTED);
      const produce = async () => {
        try {
          const [added] = await withErrorNumber(
            store.enqueue([grouped(queue, key, 2)], transaction),
            `iteration ${i}: the producer`,
          );
          if (commit) await transaction.commit();
          else await transaction.rollback();
          return added!.jobId;
        } catch (error) {
          await transaction.rollback().catch(() => undefined);
          throw error;
        }
      };
      const complete = () => withErrorNumber(completer.complete(owned([running!])), `iteration ${i}: the completion`);
      const [added, done] = producerFirst()
        ? await Promise.all([produce(), complete()])
        : await Promise.all([complete(), produce()]).then(([d, a]) => [a, d] as const);
      expect(done, `iteration ${i}`).toEqual([{ id: last, outcome: 'ok' }]);

      if (commit) {
        committed++;
        // A claim that met the job uncommitted leaves the group alone for a moment.
        const next = await waitFor(
          () => claim(queue),
          (c) => c.length > 0,
          { what: `iteration ${i}: the committed job ${added}`, timeoutMs: 5_000 },
        );
        expect(
          next.map((c) => c.id),
          `iteration ${i}`,
        ).toEqual([added]);
        await store.complete(owned(next));
      } else {
        // A head the completer saw uncommitted is recomputed (and the row deleted) by a claim.
        expect(await claim(queue), `iteration ${i}: the rolled-back job never runs`).toEqual([]);
        expect(await store.getJob(added), `iteration ${i}`).toBeNull();
      }
      const rows = await mssqlRows(db.url, groupRow(schema), (r) =>
        r.input('queue', sql.NVarChar(128), queue).input('groupKey', sql.NVarChar(255), key),
      );
      expect(rows, `iteration ${i}: an emptied group leaves no row`).toEqual([]);
      if (i % 100 === 99 || i === ITERATIONS - 1) {
        const wrong = await mssqlRows(db.url, groupDisagreements(schema), (r) =>
          r.input('queue', sql.NVarChar(128), queue),
        );
        expect(wrong, `after iteration ${i}`).toEqual([]);
      }
    }
    // Both outcomes were exercised.
    expect(committed).toBeGreaterThan(ITERATIONS / 4);
    expect(committed).toBeLessThan((3 * ITERATIONS) / 4);
    const repairs = [...(await store.repairGroups(10_000)), ...(await store.repairGroups(10_000))];
    expect(repairs.filter((r) => r.queue === queue)).toEqual([]);
  });
});
