import pg from 'pg';
import { beforeAll, describe, expect, it } from 'vitest';
import { pgQueries } from '../../lib/src/store/postgres/postgres.queries.js';
import { prepareJob } from '../../lib/src/core/producer/job-validation.js';
import { PG_URL, sql } from '../helpers/databases.js';
import { migratedPgStore } from '../helpers/pg-store.js';
import { waitFor } from '../helpers/wait-for.js';

interface PlanNode {
  'Node Type': string;
  'Relation Name'?: string;
  'Index Name'?: string;
  'Actual Rows': number;
  'Actual Loops': number;
  'Shared Hit Blocks'?: number;
  'Shared Read Blocks'?: number;
  Plans?: PlanNode[];
}

function scansOfJobs(node: PlanNode, out: PlanNode[] = []): PlanNode[] {
  if (node['Relation Name'] === 'jobs') out.push(node);
  for (const child of node.Plans ?? []) scansOfJobs(child, out);
  return out;
}

/**
 * Review P2: with jobs not due yet in the claim's index, every claim read the delayed rows of
 * higher priorities before reaching due rows. The claim's own plan (EXPLAIN ANALYZE, rolled
 * back) shows what it reads: rows of the jobs table returned or filtered out by every scan node.
 */
describe('the PostgreSQL claim reads due work only, whatever the delayed backlog', () => {
  const db = migratedPgStore('claimplan');
  const schema = db.schema;
  const queue = 'plan.q';
  const delayed = 20_000;
  const limits = { maxPayloadBytes: 1024, defaultMaxAttempts: 3 };

  beforeAll(async () => {
    const store = db.store;
    const backlog = Array.from({ length: delayed }, (_, i) =>
      prepareJob(queue, { i }, { priority: 5, delayMs: 3_600_000 }, limits),
    );
    for (let i = 0; i < backlog.length; i += 5000) await store.enqueue(backlog.slice(i, i + 5000));
    await store.enqueue(Array.from({ length: 5 }, (_, i) => prepareJob(queue, { due: i }, { priority: 0 }, limits)));
    await sql(PG_URL, `ANALYZE "${schema}".jobs`);
  }, 60_000);

  /** The claim's plan, executed (EXPLAIN ANALYZE) in the caller's open transaction. */
  async function claimScans(client: pg.Client, limit: number) {
    const { rows } = await client.query<{ 'QUERY PLAN': [{ Plan: PlanNode }] }>(
      `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ${pgQueries(schema).claim}`,
      [queue, limit, 30_000, 'plan-test', 1, false],
    );
    return scansOfJobs(rows[0]!['QUERY PLAN'][0].Plan).map((n) => ({
      node: `${n['Node Type']} ${n['Index Name'] ?? ''}`.trim(),
      rows: n['Actual Rows'] * n['Actual Loops'],
      // run_at <= now() is checked inside the index (an Index Cond, not a Filter), so rows read
      // and skipped there show only as pages.
      pages: (n['Shared Hit Blocks'] ?? 0) + (n['Shared Read Blocks'] ?? 0),
    }));
  }

  it('reads a few pages of each index, none of the 20,000 delayed rows of higher priority', async () => {
    const client = new pg.Client({ connectionString: PG_URL });
    await client.connect();
    try {
      await client.query('BEGIN');
      const scans = await claimScans(client, 2);
      const text = JSON.stringify(scans);
      const ready = scans.find((s) => s.node === 'Index Scan jobs_claim_ix');
      const promoted = scans.find((s) => s.node === 'Index Scan jobs_delayed_ix');
      expect([ready?.rows, promoted?.rows], text).toEqual([2, 0]);
      expect(
        scans.some((s) => s.node.startsWith('Seq Scan')),
        text,
      ).toBe(false);
      // The UPDATE node's pages are its own writes (heap and index entries of the leased rows).
      for (const s of scans.filter((s) => s.node.includes('Scan'))) expect(s.pages, text).toBeLessThanOrEqual(20);
      expect(ready!.pages + promoted!.pages, text).toBeLessThanOrEqual(12);

      // The measure can fail: the same backlog as 'ready' rows (what versions before 3 wrote)
      // sits in the claim index ahead of the due rows, and the claim reads through it.
      await client.query(`UPDATE "${schema}".jobs SET state = 'ready' WHERE state = 'delayed'`);
      const before = await claimScans(client, 2);
      const total = before.filter((s) => s.node.includes('Scan')).reduce((sum, s) => sum + s.pages, 0);
      expect(total, JSON.stringify(before)).toBeGreaterThan(100);
    } finally {
      await client.query('ROLLBACK').catch(() => undefined);
      await client.end();
    }
  });

  it('and the claim itself leases the due jobs', async () => {
    const claimed = await db.store.claim({ queue, limit: 10, leaseMs: 30_000, workerId: 'plan-test' });
    expect(claimed.map((c) => c.payload)).toEqual([0, 1, 2, 3, 4].map((due) => ({ due })));
    expect(await db.store.stats(queue)).toMatchObject({ ready: 0, delayed, leased: 5 });
  });
});

/**
 * The same for ordered groups: a group whose head is not due (a delayed job, a retry backing off)
 * waits outside the claim's ordered index of groups, so a claim does not walk 20,000 such groups
 * of a higher priority to reach the due ones; and once due, the first claim promotes and takes it.
 */
describe('the PostgreSQL claim reads due groups only, whatever the groups waiting for their time', () => {
  const db = migratedPgStore('claimplangrp');
  const schema = db.schema;
  const queue = 'plan.g';
  const waiting = 20_000;
  const limits = { maxPayloadBytes: 1024, defaultMaxAttempts: 3 };

  beforeAll(async () => {
    const backlog = Array.from({ length: waiting }, (_, i) =>
      prepareJob(queue, { i }, { priority: 5, delayMs: 3_600_000, groupKey: `later-${i}` }, limits),
    );
    for (let i = 0; i < backlog.length; i += 5000) await db.store.enqueue(backlog.slice(i, i + 5000));
    await db.store.enqueue(
      Array.from({ length: 5 }, (_, i) => prepareJob(queue, { due: i }, { groupKey: `now-${i}` }, limits)),
    );
    await sql(PG_URL, `ANALYZE "${schema}".jobs, "${schema}".groups`);
  }, 60_000);

  function groupScans(node: PlanNode, out: PlanNode[] = []): PlanNode[] {
    if (node['Relation Name'] === 'groups' && node['Node Type'].includes('Scan')) out.push(node);
    for (const child of node.Plans ?? []) groupScans(child, out);
    return out;
  }

  it('reads a few pages of the group indexes, none of the 20,000 waiting groups of higher priority', async () => {
    const client = new pg.Client({ connectionString: PG_URL });
    await client.connect();
    try {
      await client.query('BEGIN');
      const { rows } = await client.query<{ 'QUERY PLAN': [{ Plan: PlanNode }] }>(
        `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ${pgQueries(schema).claim}`,
        [queue, 2, 30_000, 'plan-test', 1, false],
      );
      const scans = groupScans(rows[0]!['QUERY PLAN'][0].Plan).map((n) => ({
        node: `${n['Node Type']} ${n['Index Name'] ?? ''}`.trim(),
        rows: n['Actual Rows'] * n['Actual Loops'],
        pages: (n['Shared Hit Blocks'] ?? 0) + (n['Shared Read Blocks'] ?? 0),
      }));
      const text = JSON.stringify(scans);
      expect(
        scans.some((s) => s.node.startsWith('Seq Scan')),
        text,
      ).toBe(false);
      const claimable = scans.find((s) => s.node === 'Index Scan groups_claim_ix');
      const due = scans.find((s) => s.node === 'Index Scan groups_waiting_ix');
      expect([claimable?.rows, due?.rows], text).toEqual([2, 0]);
      expect(claimable!.pages + due!.pages, text).toBeLessThanOrEqual(12);
    } finally {
      await client.query('ROLLBACK').catch(() => undefined);
      await client.end();
    }
  });

  it('and the claim leases due heads only; a waiting head is taken once due', async () => {
    const claim = () => db.store.claim({ queue, limit: 10, leaseMs: 30_000, workerId: 'plan-test' });
    // Enqueued here, not with the backlog: on a loaded machine the set-up and the plan test can
    // take longer than the head's delay, and the first claim would find it due already.
    await db.store.enqueue([prepareJob(queue, { soon: true }, { groupKey: 'soon', delayMs: 1_500 }, limits)]);
    expect((await claim()).map((c) => c.payload)).toEqual([0, 1, 2, 3, 4].map((due) => ({ due })));
    // The 'soon' group's head is due 1.5 s after its enqueue: a claim then takes it.
    const soon = await waitFor(claim, (claimed) => claimed.length > 0, { timeoutMs: 5_000, what: "the 'soon' head" });
    expect(soon.map((c) => c.payload)).toEqual([{ soon: true }]);
  });
});
