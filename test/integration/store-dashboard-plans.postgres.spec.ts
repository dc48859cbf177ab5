import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  DONE_SCAN_LIMIT,
  GROUP_SCAN_LIMIT,
  THROUGHPUT_RETENTION_MS,
  type JobListPage,
  type ListedJobState,
} from '../../lib/src/core/types.js';
import { createPostgresStore } from '../../lib/src/store/postgres/postgres.connect.js';
import type { PostgresQueueStore } from '../../lib/src/store/postgres/postgres.store.js';
import { dropPgSchema, PG_URL, sql, uniqueSchema } from '../helpers/databases.js';

interface PlanNode {
  'Node Type': string;
  'Relation Name'?: string;
  'Index Name'?: string;
  'Scan Direction'?: string;
  'Actual Rows': number;
  'Actual Loops': number;
  'Rows Removed by Filter'?: number;
  'Shared Hit Blocks': number;
  'Shared Read Blocks': number;
  Plans?: PlanNode[];
}

/** Every node of a plan, each with the node types above it. */
function nodesOf(node: PlanNode, above: string[] = [], out: { node: PlanNode; above: string[] }[] = []) {
  out.push({ node, above });
  for (const child of node.Plans ?? []) nodesOf(child, [...above, node['Node Type']], out);
  return out;
}

/** The scans of a table in a plan, as "<node type> <index>" with the rows they returned. */
function scansOf(plan: PlanNode, table: string) {
  return nodesOf(plan)
    .filter(({ node }) => node['Relation Name'] === table)
    .map(({ node, above }) => ({
      scan: `${node['Node Type']}${node['Scan Direction'] === 'Backward' ? ' Backward' : ''} ${node['Index Name'] ?? ''}`.trim(),
      rows: node['Actual Rows'] * node['Actual Loops'],
      above,
    }));
}

/**
 * The entries a plan read from `index`: the rows its scans returned and those their filter
 * dropped (a state checked on the heap), over every loop.
 */
function entriesRead(plan: PlanNode, index: string): number {
  return nodesOf(plan)
    .filter(({ node }) => node['Index Name'] === index)
    .reduce(
      (sum, { node }) => sum + (node['Actual Rows'] + (node['Rows Removed by Filter'] ?? 0)) * node['Actual Loops'],
      0,
    );
}

/** Buffers (shared, hit or read) the whole statement touched. */
const buffersOf = (plan: PlanNode) => plan['Shared Hit Blocks'] + plan['Shared Read Blocks'];

/**
 * The dashboard's reads on PostgreSQL, with statistics of a realistic table (ANALYZE, no planner
 * switches): each listing reads the partial index that already serves its state, the done
 * look-up is bounded by DONE_SCAN_LIMIT whatever the history holds, and the throughput read is a
 * range of its primary key. The plans are those of the statements the store sends (recorded on
 * its pool, with their parameters), executed by EXPLAIN ANALYZE.
 */
describe('PostgreSQL dashboard reads: plans on a realistic table', () => {
  const schema = uniqueSchema('dashplans');
  const sent: { text: string; values: unknown[] }[] = [];
  let pool: pg.Pool;
  let store: PostgresQueueStore;
  const jobs = `"${schema}".jobs`;
  /** 40,000 done jobs of a busy queue, finished over the last day, and 5 of a rare one. */
  const busyDone = 40_000;
  /**
   * A queue whose ordered groups hold 20,000 ready jobs (4 groups) and 3 delayed ones behind
   * them (at the end of two of those groups and in a group of its own after them), plus 100
   * ungrouped ready jobs: what a page of delayed jobs used to read whole.
   */
  const skewed = 'plan.skew';
  const skewedReady = 20_000;

  beforeAll(async () => {
    pool = new pg.Pool({ connectionString: PG_URL, max: 2 });
    const query = pool.query.bind(pool) as (text: string, values?: unknown[]) => Promise<pg.QueryResult>;
    pool.query = ((text: string, values: unknown[] = []) => {
      sent.push({ text, values });
      return query(text, values);
    }) as typeof pool.query;
    store = createPostgresStore({ pool }, { schema });
    await store.migrate('auto');
    const insert = (rows: string) =>
      sql(
        PG_URL,
        `INSERT INTO ${jobs} (queue, state, payload, priority, run_at, group_key, attempts, max_attempts,
  claim_token, lease_until, worker_id, created_at, claimed_at, finished_at, last_error) ${rows}`,
      );
    // Four queues of live jobs (20,000), in every state, ungrouped and in ordered groups.
    await insert(`SELECT 'plan.q' || (i % 4), 'ready', jsonb_build_object('i', i), i % 4, now() - i * interval '1 s',
  CASE WHEN i % 3 = 0 THEN 'g' || (i % 200) END, 0, 3, NULL, NULL, NULL, now(), NULL, NULL, NULL
FROM generate_series(1, 10000) AS i`);
    await insert(`SELECT 'plan.q' || (i % 4), 'delayed', jsonb_build_object('i', i), 0, now() + i * interval '1 s',
  CASE WHEN i % 4 = 0 THEN 'g' || (i % 200) END, 1, 3, NULL, NULL, NULL, now(), NULL, NULL, 'retry ' || i
FROM generate_series(1, 6000) AS i`);
    await insert(`SELECT 'plan.q' || (i % 4), 'leased', jsonb_build_object('i', i), 0, now() - interval '1 min',
  NULL, 1, 3, gen_random_uuid(), now() + (i % 60) * interval '1 s', 'w', now(), now(), NULL, NULL
FROM generate_series(1, 800) AS i`);
    await insert(`SELECT 'plan.q' || (i % 4), 'dead', jsonb_build_object('i', i), 0, now() - interval '1 day',
  NULL, 3, 3, NULL, NULL, NULL, now(), now(), now() - i * interval '1 s', repeat('boom ', 100)
FROM generate_series(1, 4000) AS i`);
    // Done rows in finishing order, as a live system writes them; the rare queue finished 3 jobs
    // two days ago, 2 a moment ago, and one per 1,000 of the busy completions in between.
    await insert(`SELECT 'plan.rare', 'done', '{}', 0, now() - interval '2 days', NULL, 1, 3, NULL, NULL, 'w',
  now() - interval '2 days', now() - interval '2 days', now() - interval '2 days' + i * interval '1 s', NULL
FROM generate_series(1, 3) AS i`);
    await insert(`SELECT CASE WHEN i % 10 = 0 THEN 'plan.q' || (i / 10 % 4) ELSE 'plan.busy' END, 'done',
  jsonb_build_object('i', i), 0, now() - interval '1 day', NULL, 1, 3, NULL, NULL, 'w', now() - interval '1 day',
  now() - interval '1 day', now() - interval '1 day' + i * interval '2 s', NULL
FROM generate_series(1, ${busyDone}) AS i`);
    await insert(`SELECT 'plan.rare', 'done', '{}', 0, now(), NULL, 1, 3, NULL, NULL, 'w', now(), now(),
  now() + i * interval '1 ms', NULL
FROM generate_series(1, 2) AS i`);
    await insert(`SELECT '${skewed}', 'ready', jsonb_build_object('i', i), 0, now() - i * interval '1 ms',
  CASE WHEN i > 100 THEN 'g' || (i % 4) END, 0, 3, NULL, NULL, NULL, now(), NULL, NULL, NULL
FROM generate_series(1, ${skewedReady + 100}) AS i`);
    await insert(`SELECT '${skewed}', 'delayed', jsonb_build_object('d', g), 0, now() + interval '1 hour', g, 1, 3,
  NULL, NULL, NULL, now(), NULL, NULL, 'retry'
FROM unnest(ARRAY['g0', 'g2', 'h']) AS g`);
    // A day of per-minute buckets for 20 queues: the whole retention.
    await sql(
      PG_URL,
      `INSERT INTO "${schema}".throughput (minute, queue, completed, failed, dead)
SELECT date_trunc('minute', now(), 'UTC') - m * interval '1 minute', 'plan.q' || q, m, q, 0
FROM generate_series(1, 1439) AS m, generate_series(1, 20) AS q`,
    );
    await sql(PG_URL, `ANALYZE ${jobs}, "${schema}".throughput`);
  }, 120_000);

  afterAll(async () => {
    await store?.close();
    await pool?.end();
    await dropPgSchema(schema);
  });

  /** Runs `read` and returns the plan (EXPLAIN ANALYZE) of the one statement it sent. */
  async function planOf(read: () => Promise<unknown>): Promise<PlanNode> {
    sent.length = 0;
    await read();
    expect(sent).toHaveLength(1);
    const { text, values } = sent[0]!;
    const rows = await sql<{ 'QUERY PLAN': [{ Plan: PlanNode }] }>(
      PG_URL,
      `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ${text}`,
      values,
    );
    return rows[0]!['QUERY PLAN'][0].Plan;
  }

  /** The plans of a first page and of the page after it (a cursor in the middle of the listing). */
  async function listingPlans(queue: string, state: ListedJobState, limit: number) {
    const first = await store.listJobs({ queue, state, limit });
    expect(first.nextCursor).not.toBeNull();
    return [
      await planOf(() => store.listJobs({ queue, state, limit })),
      await planOf(() => store.listJobs({ queue, state, limit, cursor: first.nextCursor })),
    ];
  }

  /**
   * The indexes a plan reads the jobs table through. A sequential scan fails the test. Ordered
   * and bitmap scans both pass: the planner takes a bitmap scan of the intended index where it
   * expects about a page of rows past the cursor (it reads the state's rows beyond the position
   * only), an ordered one where it expects more.
   */
  function jobIndexes(plan: PlanNode): string[] {
    const scans = scansOf(plan, 'jobs');
    expect(
      scans.filter((s) => !/^(Index (Only )?Scan|Bitmap Heap Scan)/.test(s.scan)),
      JSON.stringify(scans),
    ).toEqual([]);
    const indexes = nodesOf(plan).flatMap(({ node }) => node['Index Name'] ?? []);
    return [...new Set(indexes)].sort();
  }

  it('ready jobs: the claim index and the keyed one, then the group index; the summary by primary key', async () => {
    for (const plan of await listingPlans('plan.q1', 'ready', 50)) {
      expect(jobIndexes(plan)).toEqual(['jobs_claim_ix', 'jobs_group_ix', 'jobs_key_ready_ix', 'jobs_pk']);
    }
    // A page in the grouped part.
    let cursor: string | null = null;
    for (;;) {
      const page = await store.listJobs({ queue: 'plan.q1', state: 'ready', limit: 500, cursor });
      cursor = page.nextCursor;
      if (page.jobs.at(-1)?.groupKey) break;
    }
    const plan = await planOf(() => store.listJobs({ queue: 'plan.q1', state: 'ready', limit: 50, cursor }));
    expect(jobIndexes(plan)).toEqual(['jobs_claim_ix', 'jobs_group_ix', 'jobs_key_ready_ix', 'jobs_pk']);
  });

  it('delayed jobs: the delayed index, then the group index', async () => {
    for (const plan of await listingPlans('plan.q2', 'delayed', 50)) {
      expect(jobIndexes(plan)).toEqual(['jobs_delayed_ix', 'jobs_group_ix', 'jobs_pk']);
    }
  });

  it(`delayed jobs behind ${skewedReady} grouped ready ones: at most ${GROUP_SCAN_LIMIT} group index entries a page, each listed once`, async () => {
    const pages: JobListPage[] = [];
    const entries: number[] = [];
    const buffers: number[] = [];
    let cursor: string | null = null;
    do {
      const request = { queue: skewed, state: 'delayed' as const, limit: 50, cursor };
      const plan = await planOf(() => store.listJobs(request));
      expect(jobIndexes(plan)).toEqual(['jobs_delayed_ix', 'jobs_group_ix', 'jobs_pk']);

      entries.push(entriesRead(plan, 'jobs_group_ix'));
      buffers.push(buffersOf(plan));
      const page = await store.listJobs(request);
      pages.push(page);
      cursor = page.nextCursor;
    } while (cursor !== null && pages.length < 20);
    expect(cursor).toBeNull();
    // GROUP_SCAN_LIMIT entries a page, the last one what is left: every entry read once.
    expect(pages).toHaveLength(Math.ceil((skewedReady + 3) / GROUP_SCAN_LIMIT));
    expect(entries.slice(0, -1)).toEqual(entries.slice(0, -1).map(() => GROUP_SCAN_LIMIT));
    expect(entries.at(-1)).toBeLessThan(10);
    // A step of the walk descends the index and reads the entry's heap page: a few buffers each.
    expect(Math.max(...buffers), JSON.stringify(buffers)).toBeLessThan(4 * GROUP_SCAN_LIMIT);
    const jobs = pages.flatMap((page) => page.jobs);
    expect(jobs.map((j) => j.groupKey)).toEqual(['g0', 'g2', 'h']);
    expect(jobs.every((j) => j.state === 'delayed' && j.queue === skewed)).toBe(true);
    // Short pages and empty ones still lead on.
    expect(pages.map((page) => page.jobs.length)).toContain(0);
    expect(pages.slice(0, -1).every((page) => page.nextCursor !== null && page.jobs.length < 50)).toBe(true);
  });

  it('ready jobs: a page the ungrouped jobs fill never runs the grouped read; a grouped page reads what it lists', async () => {
    const first = await planOf(() => store.listJobs({ queue: skewed, state: 'ready', limit: 50 }));
    const groupScans = nodesOf(first).filter(({ node }) => node['Index Name'] === 'jobs_group_ix');
    expect(groupScans.length).toBeGreaterThan(0);
    for (const { node } of groupScans) expect(node['Actual Loops']).toBe(0);
    expect(entriesRead(first, 'jobs_claim_ix')).toBeLessThanOrEqual(51);
    // Past the 100 ungrouped jobs: every grouped entry is a ready job, so the read stops at the page.
    const { nextCursor } = await store.listJobs({ queue: skewed, state: 'ready', limit: 100 });
    const grouped = await planOf(() =>
      store.listJobs({ queue: skewed, state: 'ready', limit: 50, cursor: nextCursor }),
    );
    expect(entriesRead(grouped, 'jobs_group_ix')).toBe(51);
    // The walk's steps and the summaries of the jobs listed: a few buffers each.
    expect(buffersOf(grouped)).toBeLessThan(8 * 51);
  });

  it('leased jobs: the leased index', async () => {
    for (const plan of await listingPlans('plan.q2', 'leased', 20)) {
      expect(jobIndexes(plan)).toEqual(['jobs_leased_ix', 'jobs_pk']);
    }
  });

  it('dead jobs: the dead index', async () => {
    for (const plan of await listingPlans('plan.q0', 'dead', 50)) {
      expect(jobIndexes(plan)).toEqual(['jobs_dead_ix', 'jobs_pk']);
    }
  });

  it(`done jobs: at most ${DONE_SCAN_LIMIT} entries of the done index under a Limit, whatever the history`, async () => {
    for (const plan of await listingPlans('plan.q3', 'done', 50)) {
      expect(jobIndexes(plan)).toEqual(['jobs_done_ix', 'jobs_pk']);
      const done = scansOf(plan, 'jobs').find((s) => s.scan.includes('jobs_done_ix'))!;
      expect(done.scan).toBe('Index Scan Backward jobs_done_ix');
      expect(done.above, JSON.stringify(done)).toContain('Limit');
      // Out of 40,000+ done rows; the few more are the last finish time's ties, put in id order.
      expect(done.rows).toBeGreaterThanOrEqual(DONE_SCAN_LIMIT);
      expect(done.rows).toBeLessThan(DONE_SCAN_LIMIT + 100);
    }
  });

  it('done jobs: a queue whose older completions lie past the look-up is reported scanLimited', async () => {
    // Two recent jobs of the rare queue, one per page; its three old ones are out of reach.
    const first = await store.listJobs({ queue: 'plan.rare', state: 'done', limit: 1 });
    expect(first).toMatchObject({ scanLimited: false, nextCursor: expect.any(String) });
    const second = await store.listJobs({ queue: 'plan.rare', state: 'done', limit: 1, cursor: first.nextCursor });
    expect(second).toMatchObject({ scanLimited: true, nextCursor: null });
    expect([...first.jobs, ...second.jobs].map((j) => j.finishedAt!.getTime())).toEqual(
      [...first.jobs, ...second.jobs].map((j) => j.finishedAt!.getTime()).sort((a, b) => b - a),
    );
    // One page: the same two, and the same verdict.
    const whole = await store.listJobs({ queue: 'plan.rare', state: 'done', limit: 10 });
    expect(whole.jobs.map((j) => j.id)).toEqual([...first.jobs, ...second.jobs].map((j) => j.id));
    expect(whole).toMatchObject({ scanLimited: true, nextCursor: null });
    // A queue with no completion among the recent ones: an empty page, limited.
    expect(await store.listJobs({ queue: 'plan.none', state: 'done', limit: 10 })).toEqual({
      jobs: [],
      nextCursor: null,
      scanLimited: true,
    });
  });

  it('readThroughput: one range of the throughput primary key', async () => {
    const plan = await planOf(() => store.readThroughput(60));
    const scans = scansOf(plan, 'throughput');
    expect(scans.map((s) => s.scan)).toEqual([expect.stringMatching(/^(Index|Bitmap Heap) Scan/)]);
    const indexes = nodesOf(plan)
      .map(({ node }) => node['Index Name'])
      .filter(Boolean);
    expect(indexes).toEqual(['throughput_pk']);
    // 20 queues × 60 minutes, of 28,780 buckets (the current minute has none yet, or this test's).
    expect(scans[0]!.rows).toBeLessThanOrEqual(20 * 60);
  });
});

/** What only a test query can set up: buckets of past minutes, for the window and the retention. */
describe('PostgreSQL throughput: the window and the retention on the database clock', () => {
  const schema = uniqueSchema('dashtp');
  let store: PostgresQueueStore;
  const throughput = `"${schema}".throughput`;

  beforeAll(async () => {
    store = createPostgresStore({ url: PG_URL, poolSize: 2 }, { schema });
    await store.migrate('auto');
  });
  afterAll(async () => {
    await store?.close();
    await dropPgSchema(schema);
  });

  /** A bucket `minutesAgo` minutes before the start of the database's current minute. */
  const bucketAgo = (queue: string, minutesAgo: number) =>
    sql(
      PG_URL,
      `INSERT INTO ${throughput} (minute, queue, completed, failed, dead)
VALUES (date_trunc('minute', now(), 'UTC') - $2::int * interval '1 minute', $1, 1, 0, 0)`,
      [queue, minutesAgo],
    );

  it('records into the start of the database minute, and reads the last N minutes, the current one included', async () => {
    const [before] = await sql<{ minute: Date }>(PG_URL, `SELECT date_trunc('minute', now(), 'UTC') AS minute`);
    await store.recordThroughput([{ queue: 'w.now', completed: 1, failed: 2, dead: 3 }]);
    const [after] = await sql<{ minute: Date }>(PG_URL, `SELECT date_trunc('minute', now(), 'UTC') AS minute`);
    const [bucket] = await sql<{ minute: Date }>(PG_URL, `SELECT minute FROM ${throughput} WHERE queue = 'w.now'`);
    expect([before!.minute.getTime(), after!.minute.getTime()]).toContain(bucket!.minute.getTime());

    for (const ago of [1, 58, 59, 60, 61]) await bucketAgo('w.past', ago);
    const reading = await store.readThroughput(60);
    // The window is set by the database's minute when read: the current one and the 59 before it.
    const start = Math.floor(reading.now.getTime() / 60_000) * 60_000 - 59 * 60_000;
    const past = await sql<{ minute: Date }>(PG_URL, `SELECT minute FROM ${throughput} WHERE queue = 'w.past'`);
    const expected = past
      .map((row) => row.minute.getTime())
      .filter((minute) => minute >= start)
      .sort((a, b) => a - b);
    expect(expected.length).toBeGreaterThanOrEqual(3);
    expect(expected.length).toBeLessThan(5);
    expect(reading.buckets.filter((b) => b.queue === 'w.past').map((b) => b.minute.getTime())).toEqual(expected);
    expect(reading.buckets.every((b) => b.minute.getTime() >= start)).toBe(true);
    expect((await store.readThroughput(1)).buckets.filter((b) => b.queue === 'w.past')).toEqual([]);
  });

  it(`cleanup deletes buckets older than ${THROUGHPUT_RETENTION_MS / 3_600_000} h, a bounded batch at a time`, async () => {
    const day = THROUGHPUT_RETENTION_MS / 60_000;
    for (const ago of [day + 60, day + 61, day + 62]) await bucketAgo('r.old', ago);
    await bucketAgo('r.kept', day - 60);
    const keepJobs = { doneRetentionMs: 3_600_000, idempotencyRetentionMs: 3_600_000, deadRetentionMs: null };
    const left = async (queue: string) =>
      Number(
        (await sql<{ n: string }>(PG_URL, `SELECT count(*) AS n FROM ${throughput} WHERE queue = $1`, [queue]))[0]!.n,
      );
    await store.cleanup({ ...keepJobs, batchSize: 2 });
    expect(await left('r.old')).toBe(1);
    await store.cleanup({ ...keepJobs, batchSize: 2 });
    expect([await left('r.old'), await left('r.kept')]).toEqual([0, 1]);
  });
});
