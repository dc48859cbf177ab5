/**
 * Regressions from the review of ordered groups (the PostgreSQL findings of c04be5e, checked on
 * SQL Server), on both databases: a group whose first unfinished job sits below its cached head
 * runs that job next, and never stalls or runs past it.
 */
import sql from 'mssql';
import { expect, it } from 'vitest';
import type { ClaimedJob, NewJob } from '../../../lib/src/core/types.js';
import { prepareJob } from '../../../lib/src/core/producer/job-validation.js';
import { mssqlRows } from '../../helpers/mssql.js';
import { groupDisagreements, groupRow } from '../../helpers/mssql-test-queries.js';
import { waitFor } from '../../helpers/wait-for.js';
import { describeEachMssqlDatabase, useMssqlSchema } from './mssql-databases.js';

const WORKER = 'groups-review';

const grouped = (queue: string, groupKey: string, n: number): NewJob =>
  prepareJob(queue, { n }, { groupKey }, { maxPayloadBytes: 1024, defaultMaxAttempts: 3 });
const idsOf = (jobs: readonly { id: string }[]) => jobs.map((j) => j.id);
const owned = (jobs: readonly ClaimedJob[]) => jobs.map(({ id, claimToken }) => ({ id, claimToken }));
const dies = (jobs: readonly ClaimedJob[]) =>
  jobs.map(({ id, claimToken }) => ({
    id,
    claimToken,
    error: 'boom',
    stack: null,
    retryDelayMs: 0,
    dead: true,
    workerId: WORKER,
  }));

describeEachMssqlDatabase('ordered groups after review', (db) => {
  const { schema, store, newQueue } = useMssqlSchema(db, 'grprev');
  const claim = (queue: string) =>
    store.claim({ queue, limit: 10, groupBatchSize: 1, leaseMs: 60_000, workerId: WORKER });

  it('a job retried while a later dead job blocks its group runs before that job once it is retried too', async () => {
    const queue = newQueue('lower');
    await store.recordQueueSettings([{ queue, maxAttempts: 3, groupOnDead: 'continue' }]);
    const [low, high] = idsOf(
      (await store.enqueue([grouped(queue, 'g', 1), grouped(queue, 'g', 2)])).map((r) => ({ id: r.jobId })),
    );
    const first = await claim(queue);
    expect(idsOf(first)).toEqual([low]);
    await store.fail(dies(first)); // 'continue': the group goes on with `high`
    await store.recordQueueSettings([{ queue, maxAttempts: 3, groupOnDead: 'block' }]);
    const second = await claim(queue);
    expect(idsOf(second)).toEqual([high]);
    await store.fail(dies(second)); // 'block': stopped by `high`
    expect(await store.retryDead(queue, [low!])).toEqual([low]); // ready, behind the block
    expect(await store.retryDead(queue, [high!])).toEqual([high]); // unblocked, headed by `high`
    const [row] = await mssqlRows<{ HeadId: string }>(db.url, groupRow(schema), (r) =>
      r.input('queue', sql.NVarChar(128), queue).input('groupKey', sql.NVarChar(255), 'g'),
    );
    expect(row?.HeadId).toBe(high); // the cached head is above the group's first unfinished job
    // The claim leases the lower job (and heads the held row with it), not the cached head.
    const next = await waitFor(
      () => claim(queue),
      (c) => c.length > 0,
      { timeoutMs: 5_000, what: 'the lower job' },
    );
    expect(idsOf(next)).toEqual([low]);
    expect(
      await mssqlRows(db.url, groupDisagreements(schema), (r) => r.input('queue', sql.NVarChar(128), queue)),
    ).toEqual([]);
    await store.complete(owned(next));
    const after = await waitFor(
      () => claim(queue),
      (c) => c.length > 0,
      { timeoutMs: 5_000, what: 'the higher job' },
    );
    expect(idsOf(after)).toEqual([high]);
  });
});
