/**
 * Ordered groups on SQL Server (issue 11; research A (ii) 1, 2 and 7), on both databases:
 * claimers race for one group round after round; a group row held mid-claim is skipped, never
 * waited for; a producer's open transaction holds up no claim of another group and no
 * completion; overlapping producers of one group never run two of its jobs at once.
 *
 * The oracle after each scene is design (a)'s predicate (groupDisagreements): the cached state
 * of the queue's groups agrees with their jobs.
 */
import sql from 'mssql';
import { afterAll, expect, it } from 'vitest';
import type { QueueStore } from '../../../lib/src/core/queue-store.js';
import type { ClaimedJob, EnqueueOptions, NewJob } from '../../../lib/src/core/types.js';
import { prepareJob } from '../../../lib/src/core/producer/job-validation.js';
import { createMssqlStore } from '../../../lib/src/store/mssql/mssql.connect.js';
import { within } from '../../helpers/drills.js';
import { beginCallerTransaction, mssqlRows, withErrorNumber } from '../../helpers/mssql.js';
import { groupDisagreements, groupRow, leaseGroupHeadUncommitted } from '../../helpers/mssql-test-queries.js';
import { waitFor } from '../../helpers/wait-for.js';
import { describeEachMssqlDatabase, useMssqlSchema, type MssqlDatabase } from './mssql-databases.js';

const CLAIMERS = 32;
const ROUNDS = 1_000;
/** Far below the 15 s request timeout a claim or completion waiting on an open transaction would hit. */
const PROMPTLY_MS = 5_000;
const WORKER = 'groups-race';

function grouped(queue: string, groupKey: string, payload: unknown = {}, options: EnqueueOptions = {}): NewJob {
  return prepareJob(queue, payload, { ...options, groupKey }, { maxPayloadBytes: 1024, defaultMaxAttempts: 3 });
}

const idsOf = (jobs: readonly { id: string }[]) => jobs.map((j) => j.id);
const owned = (jobs: readonly ClaimedJob[]) => jobs.map(({ id, claimToken }) => ({ id, claimToken }));

async function disagreements(db: MssqlDatabase, schema: string, queue: string): Promise<unknown[]> {
  return mssqlRows(db.url, groupDisagreements(schema), (r) => r.input('queue', sql.NVarChar(128), queue));
}

describeEachMssqlDatabase('ordered groups under concurrency', (db) => {
  const { schema, store, newQueue } = useMssqlSchema(db, 'grprace', 4);
  const claimers: QueueStore[] = [];
  afterAll(() => Promise.all(claimers.map((c) => c.close())));

  const claim = (on: QueueStore, queue: string, limit = 10) =>
    on.claim({ queue, limit, groupBatchSize: 1, leaseMs: 60_000, workerId: WORKER });
  const enqueueIds = async (jobs: NewJob[], transaction?: unknown) =>
    idsOf((await store.enqueue(jobs, transaction)).map((r) => ({ id: r.jobId })));

  it(`${CLAIMERS} claimers on their own connections, ${ROUNDS} rounds over a group with 2 ready jobs: each round exactly one claims, the lower id`, async () => {
    const queue = newQueue('race');
    for (let i = 0; i < CLAIMERS; i++) claimers.push(createMssqlStore({ url: db.url, poolSize: 1 }, { schema }));
    // Every connection open before the first round, so the claims of a round meet at the server.
    await Promise.all(claimers.map((c) => c.ping(10_000)));
    let ready = await enqueueIds([grouped(queue, 'g', { n: 0 }), grouped(queue, 'g', { n: 1 })]);
    const wrong: string[] = [];
    for (let round = 0; round < ROUNDS && wrong.length === 0; round++) {
      const answers = await Promise.all(
        claimers.map((claimer, i) =>
          // Each asks for more than one unit: only the head may come back, whatever the limit.
          withErrorNumber(claim(claimer, queue, 2), `round ${round}: claimer ${i}`),
        ),
      );
      const winners = answers.filter((a) => a.length > 0);
      if (winners.length !== 1 || idsOf(winners[0]!).join() !== ready[0]) {
        wrong.push(`round ${round}: ready ${ready.join(', ')}, claims got ${JSON.stringify(winners.map(idsOf))}`);
        break;
      }
      expect(await store.complete(owned(winners[0]!))).toEqual([{ id: ready[0], outcome: 'ok' }]);
      // The next round: the job behind the head, and a new one behind it.
      const [added] = await enqueueIds([grouped(queue, 'g', { n: round + 2 })]);
      ready = [ready[1]!, added!];
    }
    expect(wrong).toEqual([]);
    expect(await disagreements(db, schema, queue)).toEqual([]);
    expect(await store.stats(queue)).toMatchObject({ ready: 2, leased: 0 });
  });

  it("a group row held mid-claim is skipped at once: the other groups' heads are claimed, none of that group", async () => {
    const queue = newQueue('midclaim');
    const [held] = await enqueueIds([grouped(queue, 'held', { n: 1 }), grouped(queue, 'held', { n: 2 })]);
    const others = await enqueueIds([grouped(queue, 'a'), grouped(queue, 'b')]);
    const claimer = await beginCallerTransaction(db.url);
    try {
      const [leased] = (
        await new sql.Request(claimer.transaction)
          .input('queue', sql.NVarChar(128), queue)
          .input('groupKey', sql.NVarChar(255), 'held')
          .query<{ HeadId: string }>(leaseGroupHeadUncommitted(schema))
      ).recordset;
      expect(leased!.HeadId).toBe(held);
      // The claim, the probe and the figures read past the row; none waits for the open transaction.
      const got = await within(
        withErrorNumber(claim(store, queue), 'the claim beside an open one'),
        PROMPTLY_MS,
        'a claim while another session holds one group mid-claim',
      );
      expect(idsOf(got).sort()).toEqual([...others].sort());
      expect(got.every((c) => c.groupKey !== 'held')).toBe(true);
      await within(store.hasClaimableWork(queue), PROMPTLY_MS, 'hasClaimableWork beside the open claim');
      await within(store.stats(queue), PROMPTLY_MS, 'stats beside the open claim');
      await store.complete(owned(got));
    } finally {
      await claimer.close();
    }
    // Rolled back: the group is as it was, and its head is claimed next.
    expect(idsOf(await claim(store, queue))).toEqual([held]);
    expect(await disagreements(db, schema, queue)).toEqual([]);
  });

  it("a producer's open transaction holds up no claim of another group, and no completion in its own", async () => {
    const queue = newQueue('openproducer');
    const [head] = await enqueueIds([grouped(queue, 'busy', { n: 1 })]);
    const [running] = await claim(store, queue);
    expect(running!.id).toBe(head);
    const producer = await beginCallerTransaction(db.url);
    try {
      // Into the held group (its row is only read), and into a new group (its row is created and
      // stays locked until the commit).
      await store.enqueue([grouped(queue, 'busy', { n: 2 }), grouped(queue, 'fresh', { n: 1 })], producer.transaction);
      const [other] = await enqueueIds([grouped(queue, 'other')]);
      const got = await within(claim(store, queue), PROMPTLY_MS, "a claim beside a producer's open transaction");
      expect(idsOf(got)).toEqual([other]);
      const done = await within(
        withErrorNumber(store.complete(owned([running!])), 'the completion'),
        PROMPTLY_MS,
        "the completion of a group's head while a producer's job for the group is not committed",
      );
      expect(done).toEqual([{ id: head, outcome: 'ok' }]);
      await store.complete(owned(got));
      // The uncommitted job is the group's head now, and not claimable until it commits.
      expect(await claim(store, queue)).toEqual([]);
      await producer.commit();
    } finally {
      await producer.close();
    }
    // A claim that found the uncommitted head left that group alone for a moment.
    const next: ClaimedJob[] = [];
    await waitFor(
      async () => next.push(...(await claim(store, queue))),
      () => next.length === 2,
      { what: 'both groups of the committed transaction' },
    );
    expect(next.map((c) => c.groupKey).sort()).toEqual(['busy', 'fresh']);
    await store.complete(owned(next));
    expect(await disagreements(db, schema, queue)).toEqual([]);
  });

  it('overlapping producers: a lower id left uncommitted holds the group; after its commit it runs, then the higher one; never two at once', async () => {
    const queue = newQueue('overlap');
    const [first] = await enqueueIds([grouped(queue, 'g', { n: 1 })]);
    const [running] = await claim(store, queue);
    expect(running!.id).toBe(first);
    const p2 = await beginCallerTransaction(db.url);
    try {
      const [lower] = idsOf(
        (await store.enqueue([grouped(queue, 'g', { n: 2 })], p2.transaction)).map((r) => ({ id: r.jobId })),
      );
      // P3, in a transaction of its own that commits: a higher id.
      const p3 = await beginCallerTransaction(db.url);
      let higher: string;
      try {
        [higher] = idsOf(
          (await store.enqueue([grouped(queue, 'g', { n: 3 })], p3.transaction)).map((r) => ({ id: r.jobId })),
        ) as [string];
        await p3.commit();
      } finally {
        await p3.close();
      }
      expect(BigInt(lower!) < BigInt(higher)).toBe(true);
      await store.complete(owned([running!]));
      // The group's head is P2's job, not committed yet: nothing of the group runs meanwhile, and
      // the claims that find the head not leasable leave the group for a moment (not held).
      for (let i = 0; i < 5; i++) expect(await claim(store, queue)).toEqual([]);
      const [row] = await mssqlRows<{ HeadId: string; HeldToken: string | null; Waiting: number }>(
        db.url,
        groupRow(schema),
        (r) => r.input('queue', sql.NVarChar(128), queue).input('groupKey', sql.NVarChar(255), 'g'),
      );
      // Set aside, it waits outside the claimable index until a claim after the pause.
      expect(row).toMatchObject({ HeadId: lower, HeldToken: null, Waiting: 1 });
      await p2.commit();
      const second = await waitFor(
        () => claim(store, queue),
        (c) => c.length > 0,
        { what: "P2's job once committed" },
      );
      expect(idsOf(second)).toEqual([lower]);
      expect(await claim(store, queue)).toEqual([]);
      await store.complete(owned(second));
      const third = await claim(store, queue);
      expect(idsOf(third)).toEqual([higher]);
      await store.complete(owned(third));
    } finally {
      await p2.close();
    }
    expect(await disagreements(db, schema, queue)).toEqual([]);
  });

  it('a delayed job read uncommitted as the next head, then rolled back: the job behind it waits for the repair sweep, which fixes the head without reporting a fault', async () => {
    const queue = newQueue('rolledbackhead');
    const [first] = await enqueueIds([grouped(queue, 'g', { n: 1 })]);
    const [running] = await claim(store, queue);
    expect(running!.id).toBe(first);
    const producer = await beginCallerTransaction(db.url);
    let behind: string;
    try {
      // A lower id, due in an hour, not committed; then a ready job behind it, committed.
      await store.enqueue([grouped(queue, 'g', { n: 2 }, { delayMs: 3_600_000 })], producer.transaction);
      [behind] = (await enqueueIds([grouped(queue, 'g', { n: 3 })])) as [string];
      // The completion's dirty read makes the uncommitted job the head, due in an hour.
      await store.complete(owned([running!]));
    } finally {
      await producer.close(); // rolled back
    }
    expect(await claim(store, queue)).toEqual([]);
    const repairs = [...(await store.repairGroups(10_000)), ...(await store.repairGroups(10_000))];
    expect(repairs.filter((r) => r.queue === queue)).toEqual([]);
    expect(idsOf(await claim(store, queue))).toEqual([behind]);
    expect(await disagreements(db, schema, queue)).toEqual([]);
  });

  it('producers of one new group serialize: the second waits for the first to commit, then joins behind its job', async () => {
    const queue = newQueue('newgroup');
    const p1 = await beginCallerTransaction(db.url);
    let second: Promise<unknown> | undefined;
    try {
      const [a] = idsOf(
        (await store.enqueue([grouped(queue, 'g', { n: 1 })], p1.transaction)).map((r) => ({ id: r.jobId })),
      );
      // The group row p1 created is locked until its commit: a second producer of the group
      // waits for it (in its existence check), an inherent wait at the idle → active edge, and
      // claims pass the row by.
      second = store.enqueue([grouped(queue, 'g', { n: 2 })]);
      expect(await claim(store, queue)).toEqual([]);
      await p1.commit();
      const [b] = (await within(second, PROMPTLY_MS, 'the second producer once the first committed')) as {
        jobId: string;
      }[];
      const first = await claim(store, queue);
      expect(idsOf(first)).toEqual([a]);
      await store.complete(owned(first));
      expect(idsOf(await claim(store, queue))).toEqual([b!.jobId]);
    } finally {
      await p1.close();
      await second?.catch(() => undefined);
    }
  });
});
