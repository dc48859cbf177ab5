import pg from 'pg';
import { afterAll, describe, expect, it } from 'vitest';
import type { ClaimedJob } from '../../lib/src/core/types.js';
import { PG_URL } from '../helpers/databases.js';
import { enqueueIds, groupDisagreements, groupJob, idsOf, owned } from '../helpers/groups.js';
import { migratedPgStore } from '../helpers/pg-store.js';
import { waitFor } from '../helpers/wait-for.js';

/**
 * Ordered groups, proof 4 (issue 11): the idle → active race. A completer finishes the last
 * job of a group while a producer adds a job to it in its own transaction, which commits or
 * rolls back. Whatever the interleaving, the new job is claimed eventually (the group is never
 * left idle with work), no deadlock or other error reaches either side, and once the group is at
 * rest its cached state agrees with its jobs (the oracle in test/helpers/groups.ts).
 */
const db = migratedPgStore('grpidle', 10);
const LANES = 8;
const ITERATIONS_PER_LANE = 250;

const clients: pg.Client[] = [];
afterAll(async () => {
  for (const client of clients) await client.end().catch(() => undefined);
});

async function openClient(): Promise<pg.Client> {
  const client = new pg.Client({ connectionString: PG_URL });
  await client.connect();
  clients.push(client);
  return client;
}

/** A random point to resume at: now, after pending I/O callbacks, or a moment later. */
function jitter(random: () => number): Promise<void> {
  const r = random();
  if (r < 0.3) return Promise.resolve();
  if (r < 0.6) return new Promise((resolve) => setImmediate(resolve));
  return new Promise((resolve) => setTimeout(resolve, Math.floor(r * 3)));
}

/** A small seeded generator: each lane draws its own sequence of orders and outcomes. */
function seeded(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state * 1_664_525 + 1_013_904_223) >>> 0;
    return state / 2 ** 32;
  };
}

/**
 * The orders the two sides can take: the producer's insert before the completion (its
 * transaction open across it), after it, or both at once with random pauses.
 */
type Order = 'insert-first' | 'complete-first' | 'together';
const ORDERS: readonly Order[] = ['insert-first', 'complete-first', 'together'];

describe('the idle → active race', () => {
  it(`${LANES * ITERATIONS_PER_LANE} iterations of "complete the last job" against "enqueue into the group, commit or roll back"`, async () => {
    const { store, schema } = db;
    const failures: string[] = [];

    async function lane(index: number): Promise<void> {
      const random = seeded(index + 1);
      const queue = `idle.${index}`;
      const key = `g${index}`;
      const producer = await openClient();
      const checker = await openClient();
      const claimHead = () =>
        store.claim({ queue, limit: 5, groupBatchSize: 1, leaseMs: 60_000, workerId: `lane-${index}` });
      const claimSoon = (what: string) => waitFor(claimHead, (c) => c.length > 0, { timeoutMs: 5_000, what });
      const [first] = await enqueueIds(store, [groupJob(queue, key, { i: -1 })]);
      let held: ClaimedJob = (await claimHead())[0]!;
      expect(held.id).toBe(first);

      for (let i = 0; i < ITERATIONS_PER_LANE && failures.length === 0; i++) {
        const order = ORDERS[Math.floor(random() * ORDERS.length)]!;
        const commit = random() < 0.5;
        const batch = random() < 0.25 ? 2 : 1;
        const at = `lane ${index} iteration ${i} (${order}, ${commit ? 'commit' : 'rollback'}, ${batch} job(s))`;
        const check = (ok: boolean, problem: () => string) => {
          if (!ok) throw new Error(problem());
        };
        try {
          await producer.query('BEGIN');
          const insert = () =>
            enqueueIds(
              store,
              Array.from({ length: batch }, (_, n) => groupJob(queue, key, { i, n })),
              producer,
            );
          const end = () => producer.query(commit ? 'COMMIT' : 'ROLLBACK');
          const complete = () => store.complete(owned([held]));
          let added: string[];
          let completed: Awaited<ReturnType<typeof complete>>;
          if (order === 'insert-first') {
            // The producer's insert is in, uncommitted, while the group empties.
            added = await insert();
            completed = await complete();
            await jitter(random);
            await end();
          } else if (order === 'complete-first') {
            completed = await complete();
            added = await insert();
            await end();
          } else {
            const produce = async () => {
              const ids = await insert();
              await jitter(random);
              await end();
              return ids;
            };
            [completed, added] = await Promise.all([jitter(random).then(complete), jitter(random).then(produce)]);
          }
          check(completed[0]?.outcome === 'ok', () => `completion ${JSON.stringify(completed)}`);

          if (commit) {
            // The new job is claimed eventually: the group did not stay idle with it.
            const claimed = await claimSoon('the new job to be claimed');
            check(idsOf(claimed).join() === added[0], () => `claimed ${idsOf(claimed)}, expected ${added[0]}`);
            held = claimed[0]!;
            if (batch === 2) {
              const behind = await claimHead();
              check(behind.length === 0, () => `claimed ${idsOf(behind)} while ${held.id} is leased`);
              await store.complete(owned([held]));
              const next = await claimSoon('the second new job to be claimed');
              check(idsOf(next).join() === added[1], () => `claimed ${idsOf(next)}, expected ${added[1]}`);
              held = next[0]!;
            }
          } else {
            // Rolled back: no job, nothing claimable; the group starts again from a committed job.
            for (const id of added) check((await store.getJob(id)) === null, () => `rolled-back job ${id} exists`);
            const none = await claimHead();
            check(none.length === 0, () => `claimed ${idsOf(none)} from an emptied group`);
            const [restart] = await enqueueIds(store, [groupJob(queue, key, { i, restart: true })]);
            const claimed = await claimSoon('the restart job to be claimed');
            check(idsOf(claimed).join() === restart, () => `claimed ${idsOf(claimed)}, expected ${restart}`);
            held = claimed[0]!;
          }
          // At rest: the cached state agrees with the jobs (a settle may still be finishing).
          await waitFor(
            () => groupDisagreements(checker, schema, { queue }),
            (p) => p.length === 0,
            { timeoutMs: 5_000, what: 'the group state to agree with its jobs' },
          );
        } catch (error) {
          await producer.query('ROLLBACK').catch(() => undefined);
          // What the group looked like then, for the report.
          const state = await groupDisagreements(checker, schema, { queue }).catch((e: Error) => [e.message]);
          failures.push(`${at}: ${(error as Error).message}; group state: ${JSON.stringify(state)}`);
          return;
        }
      }
      await store.complete(owned([held]));
    }

    await Promise.all(Array.from({ length: LANES }, (_, index) => lane(index)));
    expect(failures).toEqual([]);
    // Emptied groups are settled: the state agrees everywhere, and the repair sweep finds nothing.
    expect(
      await waitFor(
        () => groupDisagreements(PG_URL, schema),
        (p) => p.length === 0,
        { timeoutMs: 5_000, what: 'every group to be at rest' },
      ),
    ).toEqual([]);
    expect(await store.repairGroups(10_000)).toEqual([]);
  });

  it('two producers enqueue into one idle group in overlapping transactions: no deadlock, and the jobs run in id order', async () => {
    const { store, schema } = db;
    for (const firstCommits of [true, false]) {
      const queue = `overlap.${firstCommits ? 'commit' : 'rollback'}`;
      const p1 = await openClient();
      const p2 = await openClient();
      await p1.query('BEGIN');
      await p2.query('BEGIN');
      const [early] = await enqueueIds(store, [groupJob(queue, 'g', { p: 1 })], p1);
      // The second may wait for the first at the group's idle → active edge; it must not fail.
      const late = enqueueIds(store, [groupJob(queue, 'g', { p: 2 })], p2);
      await p1.query(firstCommits ? 'COMMIT' : 'ROLLBACK');
      const [second] = await late;
      await p2.query('COMMIT');
      const claim = () => store.claim({ queue, limit: 5, groupBatchSize: 1, leaseMs: 60_000, workerId: 'overlap' });
      const expected = firstCommits ? [early!, second!] : [second!];
      for (const id of expected) {
        const claimed = await waitFor(claim, (c) => c.length > 0, { timeoutMs: 5_000, what: `job ${id}` });
        expect(idsOf(claimed)).toEqual([id]);
        await store.complete(owned(claimed));
      }
      expect(await claim()).toEqual([]);
      expect(
        await waitFor(
          () => groupDisagreements(PG_URL, schema, { queue }),
          (p) => p.length === 0,
          { timeoutMs: 5_000, what: 'the group to be at rest' },
        ),
      ).toEqual([]);
    }
  });
});
