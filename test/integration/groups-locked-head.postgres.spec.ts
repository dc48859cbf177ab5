import pg from 'pg';
import { afterEach, describe, expect, it } from 'vitest';
import { withTimeout } from '../../lib/src/core/timeout.js';
import { createPostgresStore } from '../../lib/src/store/postgres/postgres.connect.js';
import { PG_URL } from '../helpers/databases.js';
import { enqueueIds, groupJob, idsOf, owned, sortIds } from '../helpers/groups.js';
import { migratedPgStore } from '../helpers/pg-store.js';

/**
 * Ordered groups, proof 3 (issue 11): claims lock and skip group rows only. While another
 * session holds a group's row (a claimer mid-claim, a completer, the settle of an emptied
 * group), a claim returns at once with the other groups' heads and the ungrouped jobs, and
 * nothing of that group; it never waits on the session.
 */
const db = migratedPgStore('grplocked', 4);
const WORKER = 'locked-head-test';
/** A claim that waited on the open session would not return before the session ends. */
const PROMPT_MS = 5_000;

const sessions: pg.Client[] = [];
afterEach(async () => {
  for (const session of sessions.splice(0)) await session.end().catch(() => undefined);
});

async function openSession(): Promise<pg.Client> {
  const session = new pg.Client({ connectionString: PG_URL });
  await session.connect();
  sessions.push(session);
  await session.query('BEGIN');
  return session;
}

/** Groups a, b, c (a with two jobs) and one ungrouped job. */
async function fill(queue: string) {
  const [a1, b1, a2, c1, u1] = await enqueueIds(db.store, [
    groupJob(queue, 'a', { k: 'a1' }),
    groupJob(queue, 'b', { k: 'b1' }),
    groupJob(queue, 'a', { k: 'a2' }),
    groupJob(queue, 'c', { k: 'c1' }),
    groupJob(queue, null, { k: 'u1' }),
  ]);
  return { a1: a1!, a2: a2!, b1: b1!, c1: c1!, u1: u1! };
}

function claim(queue: string, groupBatchSize = 5) {
  return withTimeout(
    db.store.claim({ queue, limit: 10, groupBatchSize, leaseMs: 60_000, workerId: WORKER }),
    PROMPT_MS,
    'a claim next to a locked group',
  );
}

describe('a group row held by another session', () => {
  for (const lock of ['FOR NO KEY UPDATE', 'FOR UPDATE'] as const) {
    it(`is skipped at once (${lock}, as a claimer / a settle takes it): the other groups and ungrouped jobs are claimed`, async () => {
      const queue = `locked-${lock.replace(/\W/g, '').toLowerCase()}`;
      const { a1, a2, b1, c1, u1 } = await fill(queue);
      const session = await openSession();
      const locked = await session.query(
        `SELECT group_key FROM "${db.schema}".groups WHERE queue = $1 AND group_key = 'a' ${lock}`,
        [queue],
      );
      expect(locked.rowCount).toBe(1);

      const claimed = await claim(queue);
      expect(sortIds(idsOf(claimed))).toEqual(sortIds([b1, c1, u1]));
      // The other reads a reader makes do not wait on it either.
      await withTimeout(db.store.hasClaimableWork(queue), PROMPT_MS, 'hasClaimableWork next to a locked group');
      await withTimeout(
        db.store.queueHealth({ failureWindowMs: 60_000, repeatedFailures: 3 }),
        PROMPT_MS,
        'queueHealth next to a locked group',
      );
      expect(await claim(queue)).toEqual([]);

      await session.query('ROLLBACK');
      const after = await claim(queue);
      expect(idsOf(after)).toEqual([a1, a2]);
      await db.store.complete(owned([...claimed, ...after]));
    });
  }

  it('mid-claim: a claim left uncommitted in one session hides that group from another claim, which returns at once', async () => {
    const queue = 'mid-claim';
    const { a1, a2, b1, c1, u1 } = await fill(queue);
    // Session A runs the store's own claim statement inside a transaction it leaves open: a
    // claimer caught between its statement and its commit.
    const session = await openSession();
    const inSession = { query: session.query.bind(session), connect: () => Promise.reject(new Error('one statement')) };
    const claimerA = createPostgresStore({ pool: inSession as unknown as pg.Pool }, { schema: db.schema });
    const midClaim = await claimerA.claim({ queue, limit: 1, groupBatchSize: 5, leaseMs: 60_000, workerId: 'A' });
    expect(idsOf(midClaim)).toEqual([a1, a2]);

    const claimed = await claim(queue);
    // The ungrouped job may be skipped too: A's statement may hold it as a candidate it did not lease.
    expect(sortIds(idsOf(claimed).filter((id) => id !== u1))).toEqual(sortIds([b1, c1]));
    await session.query('ROLLBACK');
    // Rolled back: nothing of A's claim remains, and the group is claimable as before.
    expect(await db.store.getJob(a1)).toMatchObject({ state: 'ready', attempts: 0, claimToken: null });
    expect(idsOf(await claim(queue, 1)).filter((id) => id !== u1)).toEqual([a1]);
  });

  it("an open producer transaction adding to a group does not hide the group's committed head", async () => {
    const queue = 'producer-open';
    const { a1, b1, c1, u1 } = await fill(queue);
    const session = await openSession();
    const [pending] = await enqueueIds(db.store, [groupJob(queue, 'a', { k: 'a3' })], session);
    const claimed = await claim(queue, 1);
    expect(sortIds(idsOf(claimed))).toEqual(sortIds([a1, b1, c1, u1]));
    await session.query('COMMIT');
    expect((await db.store.getJob(pending!))!.state).toBe('ready');
  });
});
