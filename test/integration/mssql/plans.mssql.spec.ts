/**
 * Plan evidence for the hot statements (review 2026-12-01, P1 and P3; test plan items 6 and
 * 8): with 100,000 finished jobs in the table, the actual execution plans of the claim, the
 * reaper and stats() read their filtered indexes with a seek, sort nothing, and never scan
 * the clustered index, where history accumulates.
 *
 * The statements are the store's own: each is captured as the store sends it (text and bound
 * parameters, through a pool the store shares), then run again on a connection with
 * SET STATISTICS XML ON, which returns each statement's actual plan as one more result set.
 */
import sql from 'mssql';
import { afterAll, beforeAll, expect, it } from 'vitest';
import type { QueueStore } from '../../../lib/src/core/queue-store.js';
import {
  DONE_SCAN_LIMIT,
  type ClaimedJob,
  type EnqueueOptions,
  type ListedJobState,
} from '../../../lib/src/core/types.js';
import { prepareJob } from '../../../lib/src/core/producer/job-validation.js';
import { createMssqlStore } from '../../../lib/src/store/mssql/mssql.connect.js';
import { quoteMssqlIdentifier } from '../../../lib/src/store/mssql/mssql.identifiers.js';
import { uniqueSchema } from '../../helpers/databases.js';
import { dropMssqlSchema, mssqlRows, openMssqlPool } from '../../helpers/mssql.js';
import { FILTERED_INDEXES, RECOMPILE_PLANS_OF_TABLE, STATISTICS_XML_ON } from '../../helpers/mssql-test-queries.js';
import {
  describePlan,
  operatorsOn,
  planOperators,
  type PlanOperator,
  type StatementPlan,
} from '../../helpers/showplan.js';
import { waitFor } from '../../helpers/wait-for.js';
import {
  closePlanPools,
  plansOf,
  replayWithShowplans,
  rowsReadByIndex,
  statementRecorder,
  type PlanTestPools,
} from './plan-replay.js';
import { describeEachMssqlDatabase } from './mssql-databases.js';

const HISTORY = 100_000;
const READY = 5_000;
const LEASED = 200;
const EXPIRING = 150;
const WORKER = 'plans';
/** Setting up 100,000 finished jobs takes a while on a small CI machine. */
const SETUP_MS = 600_000;

/**
 * A day of per-minute buckets before the current minute, for three queues of their own (no
 * store statement writes a past minute): what a range read of the last hour must not read.
 */
function olderBuckets(schema: string): string {
  return `INSERT INTO ${quoteMssqlIdentifier(schema)}.[Throughput] ([Minute], [Queue], [Completed], [Failed], [Dead])
SELECT DATEADD(minute, -n.[N], DATEADD(minute, DATEDIFF(minute, 0, SYSUTCDATETIME()), 0)), q.[Queue], 1, 0, 0
FROM (SELECT TOP (1440) ROW_NUMBER() OVER (ORDER BY (SELECT NULL)) AS [N] FROM sys.all_columns AS a CROSS JOIN sys.all_columns AS b) AS n
CROSS JOIN (VALUES (N'dash-old-a'), (N'dash-old-b'), (N'dash-old-c')) AS q ([Queue]);`;
}

/** What a plan test opened, closed (any may be missing when its setup failed), and its schema dropped. */
async function closePlanTest(opened: PlanTestPools, url: string, schema: string): Promise<void> {
  await closePlanPools(opened);
  await dropMssqlSchema(url, schema);
}

describeEachMssqlDatabase('actual plans of the hot statements over 100,000 finished jobs', (db) => {
  const schema = uniqueSchema('plans');
  const jobsTable = `${quoteMssqlIdentifier(schema)}.[Jobs]`;
  const queue = 'plans';
  let pool: sql.ConnectionPool;
  let planPool: sql.ConnectionPool;
  let store: QueueStore;
  let capture: ReturnType<typeof statementRecorder>;

  const job = (n: number) => prepareJob(queue, { n }, {}, { maxPayloadBytes: 1024, defaultMaxAttempts: 3 });
  const jobs = (count: number, from: number) => Array.from({ length: count }, (_, i) => job(from + i));
  const owned = (claimed: ClaimedJob[]) => claimed.map((c) => ({ id: c.id, claimToken: c.claimToken }));

  beforeAll(async () => {
    pool = await openMssqlPool(db.url, 4);
    capture = statementRecorder(pool);
    store = createMssqlStore({ pool }, { schema });
    await store.migrate('auto');

    // History: finished jobs in the claim's own queue, claimed and completed as workers would.
    for (let from = 0; from < HISTORY; from += 10_000) await store.enqueue(jobs(10_000, from));
    for (;;) {
      const claimed = await store.claim({ queue, limit: 1_000, leaseMs: 600_000, workerId: WORKER });
      if (claimed.length === 0) break;
      await store.complete(owned(claimed));
    }
    // Live work: leases running, leases expired (for the reaper), and a ready backlog.
    await store.enqueue(jobs(LEASED + EXPIRING, HISTORY));
    expect(await store.claim({ queue, limit: LEASED, leaseMs: 600_000, workerId: WORKER })).toHaveLength(LEASED);
    expect(await store.claim({ queue, limit: EXPIRING, leaseMs: 1, workerId: WORKER })).toHaveLength(EXPIRING);
    await store.enqueue(jobs(READY, HISTORY + LEASED + EXPIRING));
    await waitFor(
      async () => (await store.stats(queue)).expiredLeases,
      (n) => n === EXPIRING,
      { what: `${EXPIRING} expired leases` },
    );
    expect(await store.stats(queue)).toMatchObject({ ready: READY, leased: LEASED + EXPIRING });

    // Plans compiled during the setup saw another table; the calls under test compile afresh.
    await mssqlRows(db.url, RECOMPILE_PLANS_OF_TABLE, (r) => r.input('table', sql.NVarChar(776), jobsTable));
    planPool = await openMssqlPool(db.url, 1);
  }, SETUP_MS);

  afterAll(() => closePlanTest({ planPool, store, pool }, db.url, schema));

  /** The actual plans of what the store sent during `work`, run again with the same parameters. */
  async function actualPlans(work: () => Promise<unknown>): Promise<StatementPlan[]> {
    return plansOf(await replayWithShowplans(capture, planPool, work));
  }

  /**
   * The one UPDATE of Jobs among a batch's plans that reads `index` (the claim's, after its
   * promotion of due delayed jobs; the reaper's).
   */
  function updateOfJobs(plans: StatementPlan[], index: string): StatementPlan {
    const updates = plans.filter(
      (p) =>
        p.type === 'UPDATE' && operatorsOn(p, schema, 'Jobs').some((op) => op.objects.some((o) => o.index === index)),
    );
    expect(updates, plans.map(describePlan).join('\n\n')).toHaveLength(1);
    return updates[0]!;
  }

  function expectSeekOn(plan: StatementPlan, index: string): void {
    const seeks = operatorsOn(plan, schema, 'Jobs').filter(
      (op) => op.physicalOp === 'Index Seek' && op.objects.some((o) => o.index === index),
    );
    expect(seeks.length, `an Index Seek on ${index}\n${describePlan(plan)}`).toBeGreaterThan(0);
  }

  function expectNoSortNorScan(plan: StatementPlan): void {
    const text = describePlan(plan);
    expect(
      planOperators(plan)
        .filter((op) => op.physicalOp === 'Sort')
        .map((op) => op.logicalOp),
      `no Sort: the index order serves ORDER BY … TOP\n${text}`,
    ).toEqual([]);
    expect(
      operatorsOn(plan, schema, 'Jobs')
        .filter((op) => /Scan$/.test(op.physicalOp))
        .map((op) => op.physicalOp),
      `no scan of Jobs\n${text}`,
    ).toEqual([]);
  }

  it('claim: an ordered Index Seek on IX_Jobs_Claim, no Sort, no scan of Jobs; one seek for the queue without groups', async () => {
    const plans = await actualPlans(() =>
      store.claim({ queue, limit: 100, groupBatchSize: 1, leaseMs: 600_000, workerId: WORKER }),
    );
    const claim = updateOfJobs(plans, 'IX_Jobs_Claim');
    expectSeekOn(claim, 'IX_Jobs_Claim');
    expectNoSortNorScan(claim);
    // Ordered groups cost a queue without them the promotion of due waiting groups (an UPDATE
    // that reads an empty range of the waiting-groups index) and one probe, a seek on an empty
    // range of the claimable-groups index (an IF condition, which the showplan reader may not
    // list); nothing else of the group side runs.
    for (const plan of plans) {
      const reads = operatorsOn(plan, schema, 'Groups').filter((op) => !/Update|Insert|Delete/.test(op.physicalOp));
      expect(
        reads.map((op) => `${op.physicalOp} ${op.objects[0]?.index}`),
        describePlan(plan),
      ).toEqual(
        reads.map(() => (plan.type === 'UPDATE' ? 'Index Seek IX_Groups_Waiting' : 'Index Seek IX_Groups_Claimable')),
      );
    }
    expect(plans.filter((p) => p.type === 'UPDATE' && operatorsOn(p, schema, 'Groups').length > 0)).toHaveLength(1);
  });

  it('reap: an ordered Index Seek on IX_Jobs_Leased, led by LeaseUntil (schema version 3), no Sort, no scan of Jobs', async () => {
    const indexes = await mssqlRows<{ Index: string; Filter: string; LeadingKey: string }>(
      db.url,
      FILTERED_INDEXES,
      (r) => r.input('table', sql.NVarChar(776), jobsTable),
    );
    // Led by Queue (version 1), the reaper's ORDER BY LeaseUntil across queues could not seek.
    expect(indexes.find((i) => i.Index === 'IX_Jobs_Leased')).toMatchObject({
      LeadingKey: 'LeaseUntil',
      Filter: expect.stringContaining("'leased'"),
    });

    const plans = await actualPlans(() => store.reap(100));
    const reap = updateOfJobs(plans, 'IX_Jobs_Leased');
    expectSeekOn(reap, 'IX_Jobs_Leased');
    expectNoSortNorScan(reap);
  });

  it('stats(): every figure from an index of live rows, no clustered index scan', async () => {
    const plans = await actualPlans(() => store.stats(queue));
    const reads = plans.filter((p) => operatorsOn(p, schema, 'Jobs').length > 0);
    expect(reads.length, plans.map(describePlan).join('\n\n')).toBeGreaterThan(0);
    for (const plan of reads) {
      expect(
        operatorsOn(plan, schema, 'Jobs')
          .filter((op) => op.physicalOp === 'Clustered Index Scan' || op.physicalOp === 'Table Scan')
          .map((op) => op.physicalOp),
        describePlan(plan),
      ).toEqual([]);
    }
  });
});

describeEachMssqlDatabase('actual plans of the group statements over 10,000 finished grouped jobs', (db) => {
  const schema = uniqueSchema('gplans');
  const queue = 'gplans';
  const GROUPS = 5_000;
  let pool: sql.ConnectionPool;
  let planPool: sql.ConnectionPool;
  let store: QueueStore;
  let capture: ReturnType<typeof statementRecorder>;

  const job = (group: number, n: number) =>
    prepareJob(queue, { n }, { groupKey: `g-${group}` }, { maxPayloadBytes: 1024, defaultMaxAttempts: 3 });
  /** One job for each of the groups, in blocks of 1,000 (one statement each). */
  async function enqueueRound(n: number): Promise<void> {
    for (let from = 0; from < GROUPS; from += 1_000) {
      await store.enqueue(Array.from({ length: 1_000 }, (_, i) => job(from + i, n)));
    }
  }
  const owned = (claimed: ClaimedJob[]) => claimed.map((c) => ({ id: c.id, claimToken: c.claimToken }));

  beforeAll(async () => {
    pool = await openMssqlPool(db.url, 4);
    capture = statementRecorder(pool);
    store = createMssqlStore({ pool }, { schema });
    await store.migrate('auto');
    // History: two finished jobs per group, run as workers would (batches of two).
    await enqueueRound(1);
    await enqueueRound(2);
    for (;;) {
      const claimed = await store.claim({ queue, limit: 1_000, groupBatchSize: 2, leaseMs: 600_000, workerId: WORKER });
      if (claimed.length === 0) break;
      await store.complete(owned(claimed));
    }
    // Live: two waiting jobs per group.
    await enqueueRound(3);
    await enqueueRound(4);
    await mssqlRows(db.url, RECOMPILE_PLANS_OF_TABLE, (r) =>
      r.input('table', sql.NVarChar(776), `${quoteMssqlIdentifier(schema)}.[Jobs]`),
    );
    await mssqlRows(db.url, RECOMPILE_PLANS_OF_TABLE, (r) =>
      r.input('table', sql.NVarChar(776), `${quoteMssqlIdentifier(schema)}.[Groups]`),
    );
    planPool = await openMssqlPool(db.url, 1);
  }, SETUP_MS);

  afterAll(() => closePlanTest({ planPool, store, pool }, db.url, schema));

  /** The actual plans of the one statement the store sent during `work`, run again with its parameters. */
  async function actualPlans(work: () => Promise<unknown>): Promise<StatementPlan[]> {
    return plansOf(await replayWithShowplans(capture, planPool, work));
  }

  function seeksOn(plans: StatementPlan[], table: string, index: string): number {
    return plans
      .flatMap((p) => operatorsOn(p, schema, table))
      .filter((op) => op.physicalOp === 'Index Seek' && op.objects.some((o) => o.index === index)).length;
  }

  function expectNoScanOf(plans: StatementPlan[], table: string): void {
    for (const plan of plans) {
      expect(
        operatorsOn(plan, schema, table)
          .filter((op) => /Scan$/.test(op.physicalOp))
          .map((op) => `${op.physicalOp} ${op.objects[0]?.index}`),
        describePlan(plan),
      ).toEqual([]);
    }
  }

  it('claim: the groups are chosen by a seek on IX_Groups_Claimable (its literal filter), their batches by seeks on IX_Jobs_Group; no scan', async () => {
    const plans = await actualPlans(() =>
      store.claim({ queue, limit: 10, groupBatchSize: 2, leaseMs: 600_000, workerId: WORKER }),
    );
    expect(seeksOn(plans, 'Groups', 'IX_Groups_Claimable'), plans.map(describePlan).join('\n\n')).toBeGreaterThan(0);
    expect(seeksOn(plans, 'Jobs', 'IX_Jobs_Group'), plans.map(describePlan).join('\n\n')).toBeGreaterThan(0);
    expectNoScanOf(plans, 'Groups');
    expectNoScanOf(plans, 'Jobs');
    // The group CTE is read in its index order: no Sort on Groups' side.
    const holds = plans.filter((p) => p.type === 'UPDATE' && seeksOn([p], 'Groups', 'IX_Groups_Claimable') > 0);
    expect(holds).toHaveLength(1);
    expect(planOperators(holds[0]!).filter((op) => op.physicalOp === 'Sort')).toEqual([]);
  });

  it('hasClaimableWork: a seek on IX_Groups_Claimable and one on IX_Groups_Waiting', async () => {
    const plans = await actualPlans(() => store.hasClaimableWork(queue));
    expect(seeksOn(plans, 'Groups', 'IX_Groups_Claimable'), plans.map(describePlan).join('\n\n')).toBeGreaterThan(0);
    expect(seeksOn(plans, 'Groups', 'IX_Groups_Waiting'), plans.map(describePlan).join('\n\n')).toBeGreaterThan(0);
    expectNoScanOf(plans, 'Groups');
  });

  it("complete: the batch check seeks IX_Jobs_GroupHold and the next head IX_Jobs_Group, whatever the group's depth", async () => {
    const claim = () => store.claim({ queue, limit: 5, groupBatchSize: 1, leaseMs: 600_000, workerId: WORKER });
    const first = await claim();
    expect(first).toHaveLength(5);
    // The statement as the store sends it; replayed for other leased jobs, so that its group
    // side runs (a replay for the same jobs would find them done already).
    const [sent] = await capture(() => store.complete(owned(first)));
    const again = await claim();
    expect(again).toHaveLength(5);
    const items = new sql.Table(`${schema}.OwnedJobList`);
    items.columns.add('Id', sql.BigInt, { nullable: false });
    items.columns.add('Token', sql.UniqueIdentifier, { nullable: false });
    for (const c of again) items.rows.add(c.id, c.claimToken);
    await planPool.request().batch(STATISTICS_XML_ON);
    const replay = planPool.request().input('items', items);
    const result = await replay.query<{ Outcome: string }>(sent!.text);
    expect(
      result.recordsets
        .flatMap((rs) => (rs as unknown as { Outcome?: string }[]).map((r) => r.Outcome))
        .filter(Boolean),
    ).toEqual(again.map(() => 'ok'));
    const plans = plansOf(result.recordsets as sql.IRecordSet<Record<string, unknown>>[]);
    expect(seeksOn(plans, 'Jobs', 'IX_Jobs_GroupHold'), plans.map(describePlan).join('\n\n')).toBeGreaterThan(0);
    expect(seeksOn(plans, 'Jobs', 'IX_Jobs_Group'), plans.map(describePlan).join('\n\n')).toBeGreaterThan(0);
    expectNoScanOf(plans, 'Jobs');
    expectNoScanOf(plans, 'Groups');
  });

  it('stats(): the grouped figures from IX_Jobs_Group, the blocked groups from IX_Groups_Blocked; no clustered scan', async () => {
    const plans = await actualPlans(() => store.stats(queue));
    expect(seeksOn(plans, 'Jobs', 'IX_Jobs_Group'), plans.map(describePlan).join('\n\n')).toBeGreaterThan(0);
    expect(seeksOn(plans, 'Groups', 'IX_Groups_Blocked'), plans.map(describePlan).join('\n\n')).toBeGreaterThan(0);
    for (const table of ['Jobs', 'Groups']) {
      for (const plan of plans) {
        expect(
          operatorsOn(plan, schema, table)
            .filter((op) => op.physicalOp === 'Clustered Index Scan' || op.physicalOp === 'Table Scan')
            .map((op) => op.physicalOp),
          describePlan(plan),
        ).toEqual([]);
      }
    }
  });
});

/**
 * Review (issue 11): a group whose head is not due (a delayed job, a retry backing off) waits in
 * IX_Groups_Waiting, outside the claim's ordered index, so a claim does not step over 20,000 such
 * groups of a higher priority to reach the due ones (before, the claim, its IF EXISTS probe and
 * hasClaimableWork each read them all: HeadReadyAt comes after HeadPriority in the claimable
 * index's key, so "due" was a residual predicate). The evidence is each seek's rows read
 * (ActualRowsRead, before the residual predicate), from the actual plan.
 */
describeEachMssqlDatabase('the claim reads due groups only, whatever the groups waiting for their time', (db) => {
  const schema = uniqueSchema('gwait');
  const queue = 'gwait';
  const WAITING = 20_000;
  let pool: sql.ConnectionPool;
  let planPool: sql.ConnectionPool;
  let store: QueueStore;
  let capture: ReturnType<typeof statementRecorder>;
  const limits = { maxPayloadBytes: 1024, defaultMaxAttempts: 3 };
  const claim = (limit: number) => store.claim({ queue, limit, leaseMs: 600_000, workerId: WORKER });

  beforeAll(async () => {
    pool = await openMssqlPool(db.url, 4);
    capture = statementRecorder(pool);
    store = createMssqlStore({ pool }, { schema });
    await store.migrate('auto');
    for (let from = 0; from < WAITING; from += 1_000) {
      await store.enqueue(
        Array.from({ length: 1_000 }, (_, i) =>
          prepareJob(
            queue,
            { later: from + i },
            { priority: 5, delayMs: 3_600_000, groupKey: `later-${from + i}` },
            limits,
          ),
        ),
      );
    }
    await store.enqueue(
      Array.from({ length: 6 }, (_, i) => prepareJob(queue, { due: i }, { groupKey: `now-${i}` }, limits)),
    );
    await store.enqueue([prepareJob(queue, { soon: true }, { groupKey: 'soon', delayMs: 1_500 }, limits)]);
    await mssqlRows(db.url, RECOMPILE_PLANS_OF_TABLE, (r) =>
      r.input('table', sql.NVarChar(776), `${quoteMssqlIdentifier(schema)}.[Groups]`),
    );
    planPool = await openMssqlPool(db.url, 1);
  }, SETUP_MS);

  afterAll(() => closePlanTest({ planPool, store, pool }, db.url, schema));

  /** Rows each index of Groups was read for, over every seek or scan of the showplans in `recordsets`. */
  const groupRowsRead = (recordsets: sql.IRecordSet<Record<string, unknown>>[]) =>
    rowsReadByIndex(recordsets, schema, 'Groups');

  it('the claim and hasClaimableWork read a few rows of the group indexes, none of the 20,000 waiting groups of higher priority', async () => {
    for (const work of [() => claim(2), () => store.hasClaimableWork(queue)]) {
      const read = groupRowsRead(await replayWithShowplans(capture, planPool, work));
      const text = JSON.stringify([...read]);
      expect([...read.keys()].sort(), text).toEqual(
        expect.arrayContaining(['IX_Groups_Claimable', 'IX_Groups_Waiting']),
      );
      expect(
        [...read.keys()].filter((index) => !/^IX_Groups_(Claimable|Waiting)$/.test(index)),
        text,
      ).toEqual([]);
      // The probe, the count and the hold read two due groups each at most; of the waiting ones,
      // only 'soon' can be due (if the setup took that long).
      expect(read.get('IX_Groups_Claimable')!, text).toBeLessThanOrEqual(8);
      expect(read.get('IX_Groups_Waiting')!, text).toBeLessThanOrEqual(1);
    }
  });

  it('the claim leases due heads only; a waiting head is promoted and taken once due', async () => {
    // The first test's claims (the store's and the replay) took four of the six due heads; the
    // 'soon' head comes after them (same priority, later run time) once due.
    const first = await claim(10);
    expect(first.slice(0, 2).map((c) => c.payload)).toEqual([{ due: 4 }, { due: 5 }]);
    const soon =
      first.length > 2
        ? first.slice(2)
        : await waitFor(
            () => claim(10),
            (claimed) => claimed.length > 0,
            { timeoutMs: 10_000, what: "the 'soon' head" },
          );
    expect(soon.map((c) => c.payload)).toEqual([{ soon: true }]);
    expect(await claim(10)).toEqual([]);
  });
});

/**
 * The dashboard's reads (listJobs for each state, readThroughput) with 15,000 finished jobs in
 * the table: each listing reads the filtered index that already serves its state by seeks in
 * index order (no sort above the read, no scan of Jobs), the rows it lists by primary key; the
 * done listing reads at most DONE_SCAN_LIMIT entries of each done index (keyless and keyed jobs),
 * newest first; the throughput read is one range of its primary key.
 */
describeEachMssqlDatabase('actual plans of the dashboard reads over 15,000 finished jobs', (db) => {
  const schema = uniqueSchema('dplans');
  const queue = 'dash';
  const KEYLESS_DONE = 12_000;
  const KEYED_DONE = 3_000;
  const LIVE = 40;
  let pool: sql.ConnectionPool;
  let planPool: sql.ConnectionPool;
  let store: QueueStore;
  let capture: ReturnType<typeof statementRecorder>;
  const limits = { maxPayloadBytes: 1024, defaultMaxAttempts: 3 };
  const job = (options: EnqueueOptions, n: number) => prepareJob(queue, { n }, options, limits);
  const many = (count: number, options: (i: number) => EnqueueOptions) =>
    Array.from({ length: count }, (_, i) => job(options(i), i));

  beforeAll(async () => {
    pool = await openMssqlPool(db.url, 4);
    capture = statementRecorder(pool);
    store = createMssqlStore({ pool }, { schema });
    await store.migrate('auto');
    // History in both done indexes: completions without and with an idempotency key.
    for (let from = 0; from < KEYLESS_DONE; from += 3_000) await store.enqueue(many(3_000, () => ({})));
    await store.enqueue(many(KEYED_DONE, (i) => ({ idempotencyKey: `k-${i}` })));
    for (;;) {
      const claimed = await store.claim({ queue, limit: 1_000, leaseMs: 600_000, workerId: WORKER });
      if (claimed.length === 0) break;
      await store.complete(claimed.map((c) => ({ id: c.id, claimToken: c.claimToken })));
    }
    // Dead, then leased, then waiting jobs: ungrouped and grouped, ready and delayed.
    await store.enqueue(many(LIVE, () => ({ maxAttempts: 1 })));
    const dying = await store.claim({ queue, limit: LIVE, leaseMs: 600_000, workerId: WORKER });
    await store.fail(
      dying.map((c) => ({
        id: c.id,
        claimToken: c.claimToken,
        error: 'dies',
        stack: null,
        retryDelayMs: 0,
        dead: true,
        workerId: WORKER,
      })),
    );
    await store.enqueue(many(LIVE, () => ({})));
    expect(await store.claim({ queue, limit: LIVE, leaseMs: 600_000, workerId: WORKER })).toHaveLength(LIVE);
    await store.enqueue(many(LIVE, () => ({})));
    await store.enqueue(many(LIVE, (i) => ({ groupKey: `ready-${i % 10}` })));
    await store.enqueue(many(LIVE, () => ({ delayMs: 3_600_000 })));
    await store.enqueue(many(LIVE, (i) => ({ groupKey: `later-${i % 10}`, delayMs: 3_600_000 })));
    // Buckets: this minute's, and a day of older ones in queues of their own.
    await store.recordThroughput(
      ['a', 'b', 'c'].map((q) => ({ queue: `dash-${q}`, completed: 1, failed: 0, dead: 0 })),
    );
    await mssqlRows(db.url, olderBuckets(schema));
    for (const table of ['Jobs', 'Throughput']) {
      await mssqlRows(db.url, RECOMPILE_PLANS_OF_TABLE, (r) =>
        r.input('table', sql.NVarChar(776), `${quoteMssqlIdentifier(schema)}.[${table}]`),
      );
    }
    planPool = await openMssqlPool(db.url, 1);
  }, SETUP_MS);

  afterAll(() => closePlanTest({ planPool, store, pool }, db.url, schema));

  /** The store's one statement for `work`, run again with actual showplans: its plans and its recordsets. */
  async function replay(work: () => Promise<unknown>) {
    const recordsets = await replayWithShowplans(capture, planPool, work);
    return { recordsets, plans: plansOf(recordsets) };
  }

  /**
   * A Sort between a read of Jobs and the Top above it: the index order did not serve the ORDER
   * BY of a TOP, so the read did not stop after the rows the page needs. (A sort above the Top,
   * of the few rows it passes, orders the page's insert and is no such read.)
   */
  function sortsOverJobs(plan: StatementPlan): string[] {
    const readsJobs = (op: PlanOperator): boolean =>
      op.objects.some((o) => o.schema === schema && o.table === 'Jobs') ||
      op.children.some((child) => child.physicalOp !== 'Top' && readsJobs(child));
    return planOperators(plan)
      .filter(
        (op) => op.physicalOp === 'Sort' && op.children.some((child) => child.physicalOp !== 'Top' && readsJobs(child)),
      )
      .map((op) => op.logicalOp);
  }

  /**
   * The reads of Jobs that fill the page (INSERT INTO @page): per fill (in statement order) its
   * Index Seeks on `indexes`, with no sort above them; and the listed rows read by primary key.
   */
  function expectPageReads(plans: StatementPlan[], indexes: string[][]): void {
    const all = plans.map(describePlan).join('\n\n');
    const fills = plans.filter((p) => p.type === 'INSERT' && operatorsOn(p, schema, 'Jobs').length > 0);
    expect(
      fills.map((p) => operatorsOn(p, schema, 'Jobs').map((op) => `${op.physicalOp} ${op.objects[0]?.index}`)),
      all,
    ).toEqual(indexes.map((fill) => fill.map((index) => `Index Seek ${index}`)));
    for (const fill of fills) expect(sortsOverJobs(fill), describePlan(fill)).toEqual([]);
    const listed = plans.filter((p) => p.type === 'SELECT' && operatorsOn(p, schema, 'Jobs').length > 0);
    expect(listed, all).toHaveLength(1);
    expect(
      operatorsOn(listed[0]!, schema, 'Jobs').map((op) => `${op.physicalOp} ${op.objects[0]?.index}`),
      all,
    ).toEqual(['Clustered Index Seek PK_Jobs']);
  }

  it.each<[ListedJobState, string[][]]>([
    // A first page: the claim order's three ranges (two of them empty), then the grouped part's
    // one fill over two ranges (the rest of the position's group, the groups after it).
    ['ready', [['IX_Jobs_Claim'], ['IX_Jobs_Claim'], ['IX_Jobs_Claim'], ['IX_Jobs_Group', 'IX_Jobs_Group']]],
    ['delayed', [['IX_Jobs_Delayed'], ['IX_Jobs_Delayed'], ['IX_Jobs_Group', 'IX_Jobs_Group']]],
    ['leased', [['IX_Jobs_Leased'], ['IX_Jobs_Leased']]],
    ['dead', [['IX_Jobs_Dead']]],
  ])(
    'listJobs(%s) reads its filtered index in order, by seeks, and the listed rows by primary key',
    async (state, indexes) => {
      const { plans } = await replay(() => store.listJobs({ queue, state, limit: 2 * LIVE + 10 }));
      expectPageReads(plans, indexes);
      const page = await store.listJobs({ queue, state, limit: 2 * LIVE + 10 });
      expect(page.jobs).toHaveLength(state === 'ready' || state === 'delayed' ? 2 * LIVE : LIVE);
      expect(page.jobs.every((j) => j.state === state)).toBe(true);
    },
  );

  it('listJobs(ready) on a later page starts at the cursor: rows read follow the page, not the pages before it', async () => {
    const first = await store.listJobs({ queue, state: 'ready', limit: 30 });
    const { recordsets } = await replay(() =>
      store.listJobs({ queue, state: 'ready', limit: 30, cursor: first.nextCursor }),
    );
    const read = rowsReadByIndex(recordsets, schema, 'Jobs');
    const text = JSON.stringify([...read]);
    // 10 ungrouped jobs left and 21 grouped ready ones to fill the page; the grouped reads pass
    // over the queue's grouped delayed jobs (State is checked in the index), at most 40.
    expect(read.get('IX_Jobs_Claim')!, text).toBeLessThanOrEqual(LIVE - 30 + 2);
    expect(read.get('IX_Jobs_Group')!, text).toBeLessThanOrEqual(21 + LIVE + 2);
  });

  it('listJobs(done) looks through at most DONE_SCAN_LIMIT entries of each done index, newest first; no scan of Jobs', async () => {
    const { plans, recordsets } = await replay(() => store.listJobs({ queue, state: 'done', limit: 50 }));
    const all = plans.map(describePlan).join('\n\n');
    const read = rowsReadByIndex(recordsets, schema, 'Jobs');
    expect([...read.keys()].sort(), all).toEqual(['IX_Jobs_Done', 'IX_Jobs_DoneKeyed', 'PK_Jobs']);
    expect(read.get('IX_Jobs_Done')!).toBeLessThanOrEqual(DONE_SCAN_LIMIT);
    expect(read.get('IX_Jobs_DoneKeyed')!).toBeLessThanOrEqual(DONE_SCAN_LIMIT);
    for (const plan of plans) {
      expect(
        operatorsOn(plan, schema, 'Jobs')
          .filter((op) => op.objects.some((o) => o.index === 'PK_Jobs') && op.physicalOp !== 'Clustered Index Seek')
          .map((op) => op.physicalOp),
        describePlan(plan),
      ).toEqual([]);
    }
    const page = await store.listJobs({ queue, state: 'done', limit: 50 });
    expect(page.jobs).toHaveLength(50);
    const times = page.jobs.map((j) => j.finishedAt!.getTime());
    expect(times).toEqual([...times].sort((a, b) => b - a));
  });

  it('listJobs(done) of a queue with no recent completion reads the whole window once more to count it, and says so', async () => {
    const { recordsets } = await replay(() => store.listJobs({ queue: 'dash-none', state: 'done', limit: 50 }));
    const read = rowsReadByIndex(recordsets, schema, 'Jobs');
    const text = JSON.stringify([...read]);
    // The page's look-up and the count: each at most DONE_SCAN_LIMIT entries per index.
    expect(read.get('IX_Jobs_Done')!, text).toBeLessThanOrEqual(2 * DONE_SCAN_LIMIT);
    expect(read.get('IX_Jobs_DoneKeyed')!, text).toBeLessThanOrEqual(2 * DONE_SCAN_LIMIT);
    expect(read.get('PK_Jobs')!, text).toBeLessThanOrEqual(DONE_SCAN_LIMIT);
    expect(await store.listJobs({ queue: 'dash-none', state: 'done', limit: 50 })).toEqual({
      jobs: [],
      nextCursor: null,
      scanLimited: true,
    });
  });

  it('readThroughput seeks a range of the primary key, not the day of older buckets', async () => {
    const { plans, recordsets } = await replay(() => store.readThroughput(60));
    const all = plans.map(describePlan).join('\n\n');
    const reads = plans.flatMap((p) => operatorsOn(p, schema, 'Throughput'));
    expect(
      reads.map((op) => `${op.physicalOp} ${op.objects[0]?.index}`),
      all,
    ).toEqual(['Clustered Index Seek PK_Throughput']);
    // At most 59 older minutes of three queues, and this minute's buckets: never the day before.
    const read = rowsReadByIndex(recordsets, schema, 'Throughput').get('PK_Throughput')!;
    expect(read).toBeLessThanOrEqual(59 * 3 + 3);
    const { now, buckets } = await store.readThroughput(60);
    const since = Math.floor(now.getTime() / 60_000) * 60_000 - 59 * 60_000;
    expect(buckets.filter((b) => b.minute.getTime() < since)).toEqual([]);
    expect(buckets.filter((b) => b.queue.startsWith('dash-') && !b.queue.startsWith('dash-old-'))).toHaveLength(3);
  });
});
