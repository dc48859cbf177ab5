import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { withTimeout } from '../../lib/src/core/timeout.js';
import type { GroupRepair } from '../../lib/src/core/types.js';
import { PG_URL, sql } from '../helpers/databases.js';
import { enqueueIds, groupDisagreements, groupJob, idsOf, owned } from '../helpers/groups.js';
import { migratedPgStore } from '../helpers/pg-store.js';

/**
 * Ordered groups, proof 7 (issue 11): the repair sweep. Normal operation never leaves a group's
 * cached state disagreeing with its jobs, so on a state built through the store the sweep finds
 * nothing; a state corrupted on purpose (as a bug or a manual edit would) is found, fixed and
 * reported once per group, and the groups run again.
 */
const db = migratedPgStore('grprepair', 4);
const WORKER = 'repair-test';

function claim(queue: string, groupBatchSize = 1, leaseMs = 60_000) {
  return db.store.claim({ queue, limit: 10, groupBatchSize, leaseMs, workerId: WORKER });
}

async function run<R extends Record<string, unknown>>(text: string, params: unknown[] = []): Promise<R[]> {
  return sql<R>(PG_URL, text.replaceAll('$schema', `"${db.schema}"`), params);
}

/**
 * Runs the sweep pass after pass, enough passes of `limit` groups to visit every group of the
 * schema twice (a pass resumes where the last one stopped), collecting what it fixed.
 */
async function repairAll(limit = 1_000): Promise<GroupRepair[]> {
  const [{ groups }] = (await run<{ groups: number }>(
    `SELECT count(*)::int AS groups FROM (
       SELECT queue, group_key FROM $schema.groups
       UNION SELECT queue, group_key FROM $schema.jobs WHERE group_key IS NOT NULL
     ) AS g`,
  )) as [{ groups: number }];
  const repairs: GroupRepair[] = [];
  for (let pass = 0; pass < 2 * Math.ceil((groups + 1) / limit) + 1; pass++) {
    repairs.push(...(await db.store.repairGroups(limit)));
  }
  return repairs;
}

const keysOf = (repairs: readonly GroupRepair[], queue: string) =>
  repairs
    .filter((r) => r.queue === queue)
    .map((r) => r.groupKey)
    .sort();

describe('the repair sweep', () => {
  it('finds nothing to fix in every state the store itself produces', async () => {
    const { store } = db;
    const queue = 'clean';
    await store.recordQueueSettings([{ queue: 'clean.block', maxAttempts: 3, groupOnDead: 'block' }]);
    // held: a leased head with a job behind it
    await enqueueIds(store, [groupJob(queue, 'held', { n: 1 }), groupJob(queue, 'held', { n: 2 })]);
    // batch: two leased under one token, the first already done (the head does not move yet)
    await enqueueIds(
      store,
      [1, 2, 3].map((n) => groupJob(queue, 'batch', { n })),
    );
    // retry: the head waiting for its retry, a job behind it
    await enqueueIds(store, [groupJob(queue, 'retry', { n: 1 }), groupJob(queue, 'retry', { n: 2 })]);
    // idle: ran empty
    await enqueueIds(store, [groupJob(queue, 'emptied', { n: 1 })]);
    // waiting: never claimed, a delayed head of another priority
    await enqueueIds(store, [groupJob(queue, 'waiting', { n: 1 }, { delayMs: 3_600_000, priority: 4 })]);
    // continue: the head died, the next one is the head
    await enqueueIds(store, [groupJob(queue, 'died', { n: 1 }, { maxAttempts: 1 }), groupJob(queue, 'died', { n: 2 })]);
    // blocked: a dead head under 'block', a job behind it
    await enqueueIds(store, [
      groupJob('clean.block', 'blocked', { n: 1 }, { maxAttempts: 1 }),
      groupJob('clean.block', 'blocked', { n: 2 }),
    ]);

    const heads = await db.store.claim({ queue, limit: 10, groupBatchSize: 2, leaseMs: 60_000, workerId: WORKER });
    const byKey = (key: string) => heads.filter((h) => h.groupKey === key);
    expect(byKey('batch')).toHaveLength(2);
    await store.complete(owned(byKey('batch').slice(0, 1)));
    await store.fail([
      {
        ...owned(byKey('retry').slice(0, 1))[0]!,
        error: 'x',
        stack: null,
        retryDelayMs: 3_600_000,
        dead: false,
        workerId: WORKER,
      },
      {
        ...owned(byKey('died').slice(0, 1))[0]!,
        error: 'x',
        stack: null,
        retryDelayMs: 0,
        dead: false,
        workerId: WORKER,
      },
    ]);
    // The job after the dead one was leased in the same batch and given back: it is the head now.
    await store.complete(owned(byKey('emptied')));
    const [blockedHead] = await claim('clean.block');
    await store.fail([
      { ...owned([blockedHead!])[0]!, error: 'x', stack: null, retryDelayMs: 0, dead: false, workerId: WORKER },
    ]);
    expect((await store.stats('clean.block')).blockedGroups).toBe(1);

    expect(await groupDisagreements(PG_URL, db.schema)).toEqual([]);
    expect(await repairAll()).toEqual([]);
  });

  it('fixes a wrong head, a stale held token, a deleted row and an idle group with work, each reported once; then they run', async () => {
    const queue = 'broken';
    const ids = new Map<string, string[]>();
    for (const key of ['wrong-head', 'stale-token', 'deleted', 'idle-with-work', 'fine']) {
      ids.set(key, await enqueueIds(db.store, [groupJob(queue, key, { n: 1 }), groupJob(queue, key, { n: 2 })]));
    }
    const second = (key: string) => ids.get(key)![1]!;
    await run(
      `UPDATE $schema.groups g SET head_id = j.id, head_ready_at = j.run_at, head_priority = j.priority
       FROM $schema.jobs j WHERE j.id = $2 AND g.queue = $1 AND g.group_key = 'wrong-head'`,
      [queue, second('wrong-head')],
    );
    await run(
      `UPDATE $schema.groups SET held_token = gen_random_uuid() WHERE queue = $1 AND group_key = 'stale-token'`,
      [queue],
    );
    await run(`DELETE FROM $schema.groups WHERE queue = $1 AND group_key = 'deleted'`, [queue]);
    await run(
      `UPDATE $schema.groups SET head_id = NULL, head_ready_at = NULL, head_priority = NULL
       WHERE queue = $1 AND group_key = 'idle-with-work'`,
      [queue],
    );
    const broken = await groupDisagreements(PG_URL, db.schema, { queue });
    expect(broken).toHaveLength(4);

    const repairs = await repairAll();
    expect(keysOf(repairs, queue)).toEqual(['deleted', 'idle-with-work', 'stale-token', 'wrong-head']);
    for (const repair of repairs) expect(repair.problem).toMatch(/\S/);
    expect(await groupDisagreements(PG_URL, db.schema, { queue })).toEqual([]);
    // Every group runs from its first job again, one at a time.
    const heads = await claim(queue);
    expect(idsOf(heads).sort()).toEqual([...ids.values()].map((pair) => pair[0]!).sort());
    await db.store.complete(owned(heads));
    const nexts = await claim(queue);
    expect(idsOf(nexts).sort()).toEqual([...ids.values()].map((pair) => pair[1]!).sort());
    await db.store.complete(owned(nexts));
    expect(await repairAll()).toEqual([]);
  });

  it('visits every group over successive bounded passes, fixing each once', async () => {
    const queue = 'sweep';
    const keys = Array.from({ length: 7 }, (_, i) => `k${i}`);
    for (const key of keys) await enqueueIds(db.store, [groupJob(queue, key, { key })]);
    await run(`UPDATE $schema.groups SET head_id = NULL, head_ready_at = NULL, head_priority = NULL WHERE queue = $1`, [
      queue,
    ]);
    const repairs = await repairAll(2);
    expect(keysOf(repairs, queue)).toEqual(keys);
    expect(idsOf(await claim(queue))).toHaveLength(keys.length);
  });

  it('skips a group whose row another session holds, without waiting, and fixes it on a later pass', async () => {
    const queue = 'locked';
    await enqueueIds(db.store, [groupJob(queue, 'busy', { n: 1 })]);
    await run(`UPDATE $schema.groups SET held_token = gen_random_uuid() WHERE queue = $1`, [queue]);
    const session = new pg.Client({ connectionString: PG_URL });
    await session.connect();
    try {
      await session.query('BEGIN');
      await session.query(`SELECT 1 FROM "${db.schema}".groups WHERE queue = $1 FOR UPDATE`, [queue]);
      const skipped = await withTimeout(db.store.repairGroups(1_000), 5_000, 'a repair pass next to a locked group');
      expect(keysOf(skipped, queue)).toEqual([]);
      await session.query('ROLLBACK');
    } finally {
      await session.end();
    }
    expect(keysOf(await repairAll(), queue)).toEqual(['busy']);
    expect(await claim(queue)).toHaveLength(1);
  });
});
