import { afterAll, expect, it } from 'vitest';
import type { ClaimedJob } from '../../lib/src/core/types.js';
import { createPostgresStore } from '../../lib/src/store/postgres/postgres.connect.js';
import { PG_LATEST_VERSION, PG_MIGRATIONS, pgBootstrap } from '../../lib/src/store/postgres/postgres.migrations.js';
import { dropPgSchema, PG_URL, sql, uniqueSchema } from '../helpers/databases.js';
import { groupDisagreements, owned } from '../helpers/groups.js';
import { waitFor } from '../helpers/wait-for.js';

/**
 * Ordered groups, proof 8 (issue 11): a schema at version 1, with grouped jobs in every state
 * as version 1 wrote them (a job not due yet was 'ready' with a future run_at; a group's jobs
 * could be leased side by side), upgrades under migrations 'auto'. The groups get the rows the
 * design says (head = lowest unfinished job, held by the token of the lowest leased one), and
 * then every job runs once, in its group's id order.
 */
const schema = uniqueSchema('grpmig');
const store = createPostgresStore({ url: PG_URL, poolSize: 2 }, { schema });
afterAll(async () => {
  await store.close();
  await dropPgSchema(schema);
});

const s = `"${schema}"`;
const WORKER = 'upgrade-test';

/** One job row as version 1 wrote it; returns its id. */
async function v1Job(
  queue: string,
  group: string | null,
  state: 'ready' | 'leased' | 'done' | 'dead',
  options: { runAt?: string; lease?: string; token?: string; priority?: number } = {},
): Promise<string> {
  const leased = state === 'leased';
  const [row] = await sql<{ id: string }>(
    PG_URL,
    `INSERT INTO ${s}.jobs (queue, state, payload, priority, run_at, group_key, attempts, max_attempts, claim_token,
                            lease_until, worker_id, claimed_at, finished_at, last_error)
     VALUES ($1, $2, '{}', $3, ${options.runAt ?? 'now()'}, $4, $5, 5, $6,
             ${leased ? (options.lease ?? "now() + interval '1 hour'") : 'NULL'}, $7,
             ${state === 'ready' ? 'NULL' : 'now()'}, ${state === 'done' || state === 'dead' ? 'now()' : 'NULL'}, $8)
     RETURNING id::text AS id`,
    [
      queue,
      state,
      options.priority ?? 0,
      group,
      state === 'ready' ? 0 : 1,
      leased || state === 'done' ? (options.token ?? crypto.randomUUID()) : null,
      state === 'ready' ? null : 'v1-worker',
      state === 'dead' ? 'died under version 1' : null,
    ],
  );
  return row!.id;
}

interface GroupRow extends Record<string, unknown> {
  queue: string;
  group_key: string;
  head_id: string | null;
  held_token: string | null;
  blocked: boolean;
  cache_matches: boolean;
}

it("a version-1 schema with grouped jobs in flight upgrades under 'auto': right group rows, then every job runs once in group order", async () => {
  await sql(
    PG_URL,
    [
      ...pgBootstrap(schema),
      ...PG_MIGRATIONS.find((m) => m.version === 1)!.statements(schema),
      `INSERT INTO ${s}.schema_version (version, description) VALUES (1, 'version 1')`,
    ].join(';\n'),
  );
  const q = 'mig.q';
  const tokenA = crypto.randomUUID();
  const tokenC1 = crypto.randomUUID();
  const tokenC2 = crypto.randomUUID();
  const tokenF = crypto.randomUUID();
  // a: finished jobs first, then one leased (running now), then waiting ones, one not due yet.
  const a = [
    await v1Job(q, 'a', 'done'),
    await v1Job(q, 'a', 'dead'),
    await v1Job(q, 'a', 'leased', { token: tokenA }),
    await v1Job(q, 'a', 'ready'),
    await v1Job(q, 'a', 'ready', { runAt: "now() + interval '1 second'" }),
    await v1Job(q, 'a', 'ready'),
  ];
  // b: two waiting jobs, the first of higher priority.
  const b = [await v1Job(q, 'b', 'ready', { priority: 3 }), await v1Job(q, 'b', 'ready')];
  // c: version 1 leased two of its jobs at once; a third waits.
  const c = [
    await v1Job(q, 'c', 'leased', { token: tokenC1 }),
    await v1Job(q, 'c', 'leased', { token: tokenC2 }),
    await v1Job(q, 'c', 'ready'),
  ];
  // d: only finished jobs: no group row.
  const d = [await v1Job(q, 'd', 'done'), await v1Job(q, 'd', 'dead')];
  // e: its only job not due yet.
  const e = [await v1Job(q, 'e', 'ready', { runAt: "now() + interval '1 second'" })];
  // f: a lease that expired before the upgrade (its worker died), a job behind it.
  const f = [
    await v1Job(q, 'f', 'leased', { token: tokenF, lease: "now() - interval '1 minute'" }),
    await v1Job(q, 'f', 'ready'),
  ];
  // The same key in another queue is another group; and an ungrouped job.
  const other = [await v1Job('mig.other', 'a', 'ready')];
  const loose = await v1Job(q, null, 'ready');

  await expect(store.migrate('auto')).resolves.toEqual({ current: PG_LATEST_VERSION, latest: PG_LATEST_VERSION });

  const rows = await sql<GroupRow>(
    PG_URL,
    `SELECT g.queue, g.group_key, g.head_id::text AS head_id, g.held_token::text AS held_token, g.blocked,
            (g.head_ready_at = j.run_at AND g.head_priority = j.priority) AS cache_matches
     FROM ${s}.groups g JOIN ${s}.jobs j ON j.id = g.head_id ORDER BY g.queue, g.group_key`,
  );
  const row = (queue: string, key: string, head: string, held: string | null) => ({
    queue,
    group_key: key,
    head_id: head,
    held_token: held,
    blocked: false,
    cache_matches: true,
  });
  expect(rows).toEqual([
    row('mig.other', 'a', other[0]!, null),
    row(q, 'a', a[2]!, tokenA),
    row(q, 'b', b[0]!, null),
    row(q, 'c', c[0]!, tokenC1),
    row(q, 'e', e[0]!, null),
    row(q, 'f', f[0]!, tokenF),
  ]);
  expect(await sql(PG_URL, `SELECT count(*)::int AS n FROM ${s}.groups`)).toEqual([{ n: 6 }]);
  // Version 3 moved the jobs not due yet to 'delayed'.
  expect((await store.getJob(a[4]!))!.state).toBe('delayed');

  // The workers of version 1 finish what they were running: c's second job last.
  const finishOld = (id: string, claimToken: string) => store.complete([{ id, claimToken }]);
  expect(await finishOld(a[2]!, tokenA)).toEqual([{ id: a[2], outcome: 'ok' }]);
  expect(await finishOld(c[0]!, tokenC1)).toEqual([{ id: c[0], outcome: 'ok' }]);
  expect(await finishOld(c[1]!, tokenC2)).toEqual([{ id: c[1], outcome: 'ok' }]);
  // f's expired lease comes back through the reaper, and f runs from that job.
  await waitFor(
    async () => {
      await store.reap(100);
      return (await store.getJob(f[0]!))?.state;
    },
    (state) => state === 'ready',
    { what: "f's expired lease to be reaped" },
  );

  // Drain: every claim's jobs run (complete) before the next claim; no group may have two jobs
  // in one claim, and each group's jobs must come in id order.
  const ran: ClaimedJob[] = [];
  const waiting = [...a.slice(3), ...b, c[2]!, ...e, ...f, ...other, loose];
  await waitFor(
    async () => {
      const claimed = await store.claim({ queue: q, limit: 10, groupBatchSize: 1, leaseMs: 60_000, workerId: WORKER });
      claimed.push(
        ...(await store.claim({ queue: 'mig.other', limit: 10, groupBatchSize: 1, leaseMs: 60_000, workerId: WORKER })),
      );
      const groups = claimed.filter((j) => j.groupKey !== null).map((j) => `${j.queue}/${j.groupKey}`);
      expect(new Set(groups).size).toBe(groups.length);
      ran.push(...claimed);
      expect(await store.complete(owned(claimed))).toEqual(claimed.map((j) => ({ id: j.id, outcome: 'ok' })));
      return ran.length;
    },
    (count) => count >= waiting.length,
    { what: 'every waiting job to run', intervalMs: 50 },
  );
  expect(ran.map((j) => j.id).sort()).toEqual([...waiting].sort());
  const order = (queue: string, key: string) =>
    ran.filter((j) => j.queue === queue && j.groupKey === key).map((j) => j.id);
  expect(order(q, 'a')).toEqual(a.slice(3));
  expect(order(q, 'b')).toEqual(b);
  expect(order(q, 'c')).toEqual([c[2]]);
  expect(order(q, 'e')).toEqual(e);
  expect(order(q, 'f')).toEqual(f);
  expect(ran.find((j) => j.id === f[0])!.attempt).toBe(2);
  expect(await store.claim({ queue: q, limit: 10, groupBatchSize: 1, leaseMs: 60_000, workerId: WORKER })).toEqual([]);
  expect(await groupDisagreements(PG_URL, schema)).toEqual([]);
  // d's finished jobs are as they were.
  expect((await Promise.all(d.map((id) => store.getJob(id)))).map((j) => j!.state)).toEqual(['done', 'dead']);
});
