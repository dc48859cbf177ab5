import sql from 'mssql';
import { SqlQueueError, SqlQueueTransactionError, SqlQueueValidationError } from '../../core/errors.js';
import {
  checkJobListRequest,
  encodeJobListCursor,
  splitJobListRows,
  type JobListPosition,
  JOB_LIST_STATEMENTS,
} from '../../core/listing/index.js';
import { assertThroughputMinutes, sumThroughputByQueue } from '../../core/throughput/index.js';
import { assertJobId } from '../../core/producer/index.js';
import {
  FLOW_KEYS_AHEAD,
  FLOW_KEYS_MAX,
  type HandlerTransaction,
  type MigrationMode,
  type QueueStore,
  type SchemaStatus,
} from '../../core/queue-store.js';
import { FlowRouting } from '../flow-routing.js';
import type { ScaleInputs } from '../../core/scaling/index.js';
import { assertSchemaVersion } from '../../core/maintenance/index.js';
import { MAX_TRACE_CONTEXT_LENGTH } from '../../core/tracing.js';
import type {
  AttemptRecord,
  BlockedGroupPage,
  CancelOutcome,
  CancelResult,
  CleanupRequest,
  ClaimedJob,
  CompleteItem,
  ClaimRequest,
  CompleteResult,
  DeadJobPage,
  EnqueueResult,
  FailItem,
  FailResult,
  FlowUsage,
  GroupRepair,
  HeartbeatItem,
  HeartbeatResult,
  JobId,
  JobListPage,
  JobListRequest,
  JobRecord,
  JobState,
  JobSummary,
  NewJob,
  OwnedJob,
  ReleaseItem,
  OwnershipOutcome,
  QueueHealth,
  QueueHealthRequest,
  QueuePause,
  QueueSetting,
  QueueStats,
  ReapedJob,
  ThroughputCount,
  ThroughputReading,
} from '../../core/types.js';
import { DONE_SCAN_LIMIT, THROUGHPUT_RETENTION_MS } from '../../core/types.js';
import type {
  ScheduleFiring,
  ScheduleRow,
  ScheduleSource,
  ScheduleStore,
  ScheduleUpsert,
} from '../../core/schedules/index.js';
import { assertSchemaName, INT_MAX, settingsByQueue } from '../../core/validation.js';
import { withTimeout } from '../../core/timeout.js';
import { errorNumber, isLockConflict, isMssqlRefusal, isTransientMssqlError } from './mssql.errors.js';
import { assertMssqlSchemaName } from './mssql.identifiers.js';
import { connectionOf, discardIfStillInTransaction, rollbackOrClose } from './mssql.handler-connection.js';
import {
  MSSQL_LATEST_VERSION,
  MSSQL_MIGRATIONS,
  mssqlBootstrap,
  mssqlMigrationLock,
  mssqlMigrationLockResource,
  mssqlReadVersion,
  mssqlRecordVersion,
} from './mssql.migrations.js';
import {
  MSSQL_AUTOCOMMIT_SESSION,
  MSSQL_CALLER_TRANSACTION_GONE,
  MSSQL_NESTED_OWN_TRANSACTION,
  MSSQL_NO_STORE_TRANSACTION,
  MSSQL_OPEN_TRANSACTION,
  MSSQL_OWN_TRANSACTION_GUARD,
  MSSQL_TABLE_TYPES,
  mssqlQueries,
  type MssqlQueries,
} from './mssql.queries.js';
import {
  type Columns,
  jobFields,
  newJobValues,
  pascalCaseColumns,
  toQueueHealth,
  toFlowUsage,
  toScaleInputs,
  toQueueStats,
  toScheduleRow,
} from '../rows.js';

const COLUMNS: Columns = pascalCaseColumns();
const LOCK_CONFLICT_RETRIES = 3;
/**
 * Rows per statement for the loops that touch a whole set (purgeDead, retryDead 'all', and the
 * cap on one cleanup statement). Lock escalation is off on Jobs and Attempts (migration 1, so a
 * bulk statement never takes the table lock READPAST cannot skip), so every row a statement
 * touches keeps its key locks in the clustered index and in each filtered index it leaves or
 * enters (plus cascaded Attempts rows) until the statement ends: lock memory and the time other
 * sessions wait grow with the batch. The cap keeps each statement under 5,000 locks per index,
 * the count at which SQL Server itself would have escalated had escalation been on ("a single
 * Transact-SQL statement acquires at least 5,000 locks on a single nonpartitioned table or
 * index", https://learn.microsoft.com/sql/relational-databases/sql-server-transaction-locking-and-row-versioning-guide).
 */
const SET_BATCH = 4_000;
const MIGRATION_LOCK_TIMEOUT_MS = 120_000;
const IDEMPOTENT_ENQUEUE_ROUNDS = 3;
/** Cannot insert a duplicate key: 2601 (unique index, UX_Jobs_Idempotency), 2627 (constraint). */
const DUPLICATE_KEY = new Set([2601, 2627]);
/** Offsets are split into int seconds by the SQL, so this is the largest that fits (~68 years). */
const MAX_OFFSET_MS = INT_MAX * 1000;
/**
 * The repair sweep looks at a group twice, this far apart, and fixes it only if its row did not
 * change in between: a transition caught half-way (its job written, its group row not yet)
 * looks like a fault for a moment, and is done long before the second look.
 */
const REPAIR_RECHECK_MS = 250;
/** Where the repair sweep resumes: the last group it looked at, or null to start over. */
interface SweepCursor {
  queue: string;
  key: string;
}

type Row = Record<string, unknown>;
type Bind = (request: sql.Request) => void;

export class MssqlQueueStore implements QueueStore, ScheduleStore {
  readonly dialect = 'mssql';

  /** mssql keeps the config a pool was built from (pool.max defaults to 10). */
  get poolSize(): number {
    return (this.pool as unknown as { config?: { pool?: { max?: number } } }).config?.pool?.max ?? 10;
  }
  private readonly sql: MssqlQueries;
  private readonly flowRouting = new FlowRouting();
  private connecting: Promise<sql.ConnectionPool> | null = null;
  /** The repair sweep's two cursors: over group rows, and over groups that have unfinished jobs. */
  private rowSweep: SweepCursor | null = null;
  private orphanSweep: SweepCursor | null = null;
  /** Set by close() on a pool the store opened: mssql would open a closed pool again on the next request. */
  private closed = false;

  constructor(
    private readonly pool: sql.ConnectionPool,
    private readonly ownsPool: boolean,
    readonly schema: string,
  ) {
    assertMssqlSchemaName(assertSchemaName(schema));
    this.sql = mssqlQueries(schema);
  }

  /**
   * The store's pool, connected (lazily and once; a pool the application connected itself is
   * used as it is). The Service Broker transport shares it for its autocommit statements and
   * sends, and derives its reader pool from the pool's config.
   */
  connected(): Promise<sql.ConnectionPool> {
    if (this.closed) {
      return Promise.reject(
        new SqlQueueError(
          `the SQL Server store of schema '${this.schema}' is closed: create a new store to use it again`,
        ),
      );
    }
    if (this.pool.connected) return Promise.resolve(this.pool);
    this.connecting ??= this.pool.connect().finally(() => {
      this.connecting = null;
    });
    return this.connecting;
  }

  async migrate(mode: MigrationMode): Promise<SchemaStatus> {
    if (mode === 'off') return { current: -1, latest: MSSQL_LATEST_VERSION };
    const pool = await this.connected();
    // 'check', or already current: nothing to install, so no lock, no transaction and no DDL.
    // In autocommit the read carries the session guard: on a pooled connection an application
    // left with IMPLICIT_TRANSACTIONS ON, the SELECT would open a transaction nobody commits.
    const installed = await this.readVersion(pool.request(), MSSQL_AUTOCOMMIT_SESSION);
    if (mode === 'check' || installed >= MSSQL_LATEST_VERSION) {
      assertSchemaVersion('mssql', this.schema, installed, MSSQL_LATEST_VERSION, mode);
      return { current: installed, latest: MSSQL_LATEST_VERSION };
    }
    const transaction = new sql.Transaction(pool);
    await transaction.begin(sql.ISOLATION_LEVEL.READ_COMMITTED);
    try {
      // The lock may wait for another instance's install: longer than the default request timeout.
      const request = () => requestWithTimeout(transaction, MIGRATION_LOCK_TIMEOUT_MS + 30_000);
      await request()
        .input('resource', sql.NVarChar(255), mssqlMigrationLockResource(this.schema))
        .input('timeoutMs', sql.Int, MIGRATION_LOCK_TIMEOUT_MS)
        .batch(`${MSSQL_OWN_TRANSACTION_GUARD}${mssqlMigrationLock()}`);
      for (const batch of mssqlBootstrap(this.schema)) await request().batch(batch);
      const current = await this.readVersion(request(), '');
      assertSchemaVersion('mssql', this.schema, current, MSSQL_LATEST_VERSION, 'auto');
      for (const migration of MSSQL_MIGRATIONS.filter((m) => m.version > current)) {
        for (const batch of migration.batches(this.schema)) await request().batch(batch);
        await request()
          .input('version', sql.Int, migration.version)
          .input('description', sql.NVarChar(400), migration.description)
          .query(mssqlRecordVersion(this.schema));
      }
      await transaction.commit();
      return { current: MSSQL_LATEST_VERSION, latest: MSSQL_LATEST_VERSION };
    } catch (error) {
      await transaction.rollback().catch(() => undefined);
      if (errorNumber(error) === MSSQL_NESTED_OWN_TRANSACTION) throw nestedOwnTransaction('migrate', error);
      throw error;
    }
  }

  /** `.query()`, so the session options of `session` revert when the sp_executesql batch ends. */
  private async readVersion(request: sql.Request, session: string): Promise<number> {
    const result = await request.query<{ Version: number }>(`${session}${mssqlReadVersion(this.schema)}`);
    return Number(result.recordset?.[0]?.Version ?? 0);
  }

  /**
   * One statement per call (enqueueOne for a single job). In autocommit the statement runs in a
   * transaction of its own; a duplicate-key error can then only come from a writer that does not
   * take the key lock (an instance of an older version during a rolling upgrade, or the
   * application's own insert), and the statement was rolled back whole: it is run again, and
   * its existence check now finds the other writer's committed job (created: false). In the
   * caller's transaction every error is the caller's to handle.
   */
  async enqueue(jobs: readonly NewJob[], transaction?: unknown): Promise<EnqueueResult[]> {
    if (jobs.length === 0) return [];
    const callerTransaction = transaction === undefined ? null : asCallerTransaction(transaction);
    const keyed = jobs.some((job) => job.idempotencyKey !== null);
    // Jobs without a group key keep the statements they always had (and their cost).
    const grouped = jobs.some((job) => job.groupKey !== null);
    for (let round = 1; ; round++) {
      try {
        const rows =
          jobs.length === 1
            ? (
                await this.run<{ Id: string; Created: boolean }>(
                  grouped ? 'enqueueOneGrouped' : 'enqueueOne',
                  (request) => bindOne(jobs[0]!)(request.input('inTransaction', sql.Bit, callerTransaction !== null)),
                  callerTransaction,
                )
              ).map((row) => ({ ...row, Ord: 0 }))
            : await this.run<{ Ord: number; Id: string; Created: boolean }>(
                grouped ? 'enqueueManyGrouped' : 'enqueueMany',
                (request) =>
                  request
                    .input('jobs', this.jobInputTable(jobs))
                    .input('inTransaction', sql.Bit, callerTransaction !== null),
                callerTransaction,
              );
        const results: EnqueueResult[] = new Array(jobs.length);
        for (const row of rows) results[row.Ord] = { jobId: row.Id, created: Boolean(row.Created) };
        return results;
      } catch (error) {
        const duplicateKey = DUPLICATE_KEY.has(errorNumber(error) ?? 0);
        // A group row is created under the group's application lock, so a duplicate on it would
        // also come only from a writer that does not take it.
        if (!duplicateKey || !(keyed || grouped) || callerTransaction || round >= IDEMPOTENT_ENQUEUE_ROUNDS)
          throw error;
      }
    }
  }

  private jobInputTable(jobs: readonly NewJob[]): sql.Table {
    const table = new sql.Table(`${this.schema}.${MSSQL_TABLE_TYPES.jobInput}`);
    table.columns.add('Ord', sql.Int, { nullable: false });
    table.columns.add('Queue', sql.NVarChar(128), { nullable: false });
    table.columns.add('Payload', sql.NVarChar(sql.MAX), { nullable: false });
    table.columns.add('Priority', sql.Int, { nullable: false });
    table.columns.add('RunAt', sql.DateTime2(3), { nullable: true });
    table.columns.add('DelayMs', sql.BigInt, { nullable: false });
    table.columns.add('GroupKey', sql.NVarChar(255), { nullable: true });
    table.columns.add('IdempotencyKey', sql.NVarChar(255), { nullable: true });
    table.columns.add('MaxAttempts', sql.Int, { nullable: true });
    table.columns.add('DefaultMaxAttempts', sql.Int, { nullable: false });
    table.columns.add('TraceContext', sql.VarChar(MAX_TRACE_CONTEXT_LENGTH), { nullable: true });
    table.columns.add('ConcurrencyKey', sql.NVarChar(255), { nullable: true });
    jobs.forEach((job, ord) => table.rows.add(ord, ...newJobValues(job), job.concurrencyKey));
    return table;
  }

  /** One autocommit upsert per queue, in queue order; boot-time only, so a few round trips. */
  async recordQueueSettings(settings: readonly QueueSetting[]): Promise<void> {
    for (const setting of settingsByQueue(settings)) {
      const limits = setting.limits ?? null;
      await this.run('recordQueueSetting', (request) =>
        request
          .input('queue', sql.NVarChar(128), setting.queue)
          .input('maxAttempts', sql.Int, setting.maxAttempts)
          .input('groupOnDead', sql.VarChar(8), setting.groupOnDead)
          .input('globalConcurrency', sql.Int, limits?.globalConcurrency ?? null)
          .input('concurrencyPerKey', sql.Int, limits?.concurrencyPerKey ?? null)
          .input('rateMax', sql.Int, limits?.rateLimit?.max ?? null)
          .input('ratePerMs', sql.Int, limits?.rateLimit?.perMs ?? null)
          .input('keyRateMax', sql.Int, limits?.rateLimitPerKey?.max ?? null)
          .input('keyRatePerMs', sql.Int, limits?.rateLimitPerKey?.perMs ?? null),
      );
    }
  }

  private ownedTable(items: readonly OwnedJob[]): sql.Table {
    const table = new sql.Table(`${this.schema}.${MSSQL_TABLE_TYPES.owned}`);
    table.columns.add('Id', sql.BigInt, { nullable: false });
    table.columns.add('Token', sql.UniqueIdentifier, { nullable: false });
    for (const item of uniqueById(items)) table.rows.add(item.id, item.claimToken);
    return table;
  }

  async claim(request: ClaimRequest): Promise<ClaimedJob[]> {
    return this.flowRouting.claim(
      request,
      async (ordinary) => {
        const [rows = [], handOver] = await this.runForResults('claim', this.bindClaim(ordinary));
        // The batch's second result says the queue is the flow claim's (flow-routing.ts).
        return { claimed: rows.map(toClaimedJob), handOver: handOver !== undefined };
      },
      (flow) => this.flowClaim(flow),
    );
  }

  claimRetryHintMs(queue: string): number | null {
    return this.flowRouting.retryHintMs(queue);
  }

  /**
   * The claim of a queue with flow limits or concurrency keys (flow.queries.ts): one batch in one
   * transaction holding the queue's FlowState row, so that the counts it leases against are exact.
   */
  private async flowClaim(request: ClaimRequest): Promise<ClaimedJob[]> {
    const [rows = [], [outcome] = []] = await this.runForResults('flowClaim', (r) =>
      this.bindClaim(request)(r).input('keysAhead', sql.Int, FLOW_KEYS_AHEAD).input('keysMax', sql.Int, FLOW_KEYS_MAX),
    );
    this.flowRouting.noteRateWindow(request.queue, (outcome?.RateFreeInMs as number | null | undefined) ?? null);
    return rows.map(toClaimedJob);
  }

  private bindClaim(request: ClaimRequest): (r: sql.Request) => sql.Request {
    return (r) =>
      r
        .input('queue', sql.NVarChar(128), request.queue)
        .input('limit', sql.Int, request.limit)
        .input('groupBatchSize', sql.Int, Math.max(1, Math.min(request.groupBatchSize ?? 1, INT_MAX)))
        .input('leaseMs', sql.Int, Math.min(request.leaseMs, INT_MAX))
        .input('workerId', sql.NVarChar(255), request.workerId);
  }

  async flowUsage(queue: string, top: number): Promise<FlowUsage> {
    const [row] = await this.run<Row>('flowUsage', (r) =>
      r.input('queue', sql.NVarChar(128), queue).input('top', sql.Int, Math.max(0, Math.min(top, INT_MAX))),
    );
    return toFlowUsage(queue, row, COLUMNS);
  }

  async heartbeat(items: readonly HeartbeatItem[]): Promise<HeartbeatResult[]> {
    if (items.length === 0) return [];
    const table = new sql.Table(`${this.schema}.${MSSQL_TABLE_TYPES.heartbeat}`);
    table.columns.add('Id', sql.BigInt, { nullable: false });
    table.columns.add('Token', sql.UniqueIdentifier, { nullable: false });
    table.columns.add('LeaseMs', sql.Int, { nullable: false });
    table.columns.add('MaxMs', sql.Int, { nullable: true });
    table.columns.add('Progress', sql.NVarChar(sql.MAX), { nullable: true });
    for (const item of uniqueById(items)) {
      table.rows.add(
        item.id,
        item.claimToken,
        Math.min(item.leaseMs, INT_MAX),
        item.maxDurationMs === null ? null : Math.min(item.maxDurationMs, INT_MAX),
        item.progress ?? null,
      );
    }
    const rows = await this.run<{ Id: string; LeaseUntil: Date | null; Cancel: boolean; CancelReason: string | null }>(
      'heartbeat',
      (r) => r.input('items', table),
    );
    return rows.map((row) => ({
      id: row.Id,
      outcome: row.LeaseUntil ? 'ok' : 'lost',
      leaseUntil: row.LeaseUntil,
      ...(row.LeaseUntil && row.Cancel ? { cancel: { reason: row.CancelReason ?? null } } : {}),
    }));
  }

  async complete(items: readonly CompleteItem[]): Promise<CompleteResult[]> {
    if (items.length === 0) return [];
    const rows = await this.run<{ Id: string; Outcome: OwnershipOutcome }>('complete', (r) =>
      r.input('items', this.completionTable(items)),
    );
    return rows.map((row) => ({ id: row.Id, outcome: row.Outcome }));
  }

  private completionTable(items: readonly CompleteItem[]): sql.Table {
    const table = new sql.Table(`${this.schema}.${MSSQL_TABLE_TYPES.completion}`);
    table.columns.add('Id', sql.BigInt, { nullable: false });
    table.columns.add('Token', sql.UniqueIdentifier, { nullable: false });
    table.columns.add('Result', sql.NVarChar(sql.MAX), { nullable: true });
    table.columns.add('Progress', sql.NVarChar(sql.MAX), { nullable: true });
    for (const item of uniqueById(items)) {
      table.rows.add(item.id, item.claimToken, item.result ?? null, item.progress ?? null);
    }
    return table;
  }

  /**
   * A transactional handler's transaction: an mssql Transaction on the store's pool (READ
   * COMMITTED; one pooled connection held until it ends), handed to the handler as the
   * transaction the producer accepts. The completion runs in it (completeInTransaction).
   */
  async beginHandlerTransaction(): Promise<HandlerTransaction> {
    const transaction = new sql.Transaction(await this.connected());
    await transaction.begin(sql.ISOLATION_LEVEL.READ_COMMITTED);
    const connection = connectionOf(transaction);
    return {
      handle: transaction,
      complete: async (item) => {
        const [row] = await this.run<{ Id: string; Outcome: OwnershipOutcome }>(
          'completeInTransaction',
          (r) => r.input('items', this.completionTable([item])),
          transaction,
        );
        return { id: item.id, outcome: row?.Outcome ?? 'lost' };
      },
      commit: async () => {
        try {
          await transaction.commit();
        } catch (error) {
          discardIfStillInTransaction(connection);
          throw error;
        }
      },
      rollback: () => rollbackOrClose(transaction, connection),
      readBack: (id) => this.readJob('getJobAfterWriters', id),
    };
  }

  /**
   * Failures, and the acknowledged cancellations among them (a statement of their own: the
   * FailureList type has no column to tell them apart, and a table type cannot be altered).
   */
  async fail(items: readonly FailItem[]): Promise<FailResult[]> {
    const canceled = items.filter((item) => item.canceled === true);
    if (canceled.length === 0) return this.failStatement('fail', items);
    const failed = items.filter((item) => item.canceled !== true);
    const results = [
      ...(await this.failStatement('fail', failed)),
      ...(await this.failStatement('cancelAck', canceled)),
    ];
    const byId = new Map(results.map((result) => [result.id, result]));
    return uniqueById(items).map((item) => byId.get(item.id)!);
  }

  private async failStatement(name: 'fail' | 'cancelAck', items: readonly FailItem[]): Promise<FailResult[]> {
    if (items.length === 0) return [];
    const rows = await this.run<{ Id: string; Outcome: OwnershipOutcome; State: FailResult['state'] }>(name, (r) =>
      r.input('items', this.failureTable(items)),
    );
    return rows.map((row) => ({ id: row.Id, outcome: row.Outcome, state: row.State ?? null }));
  }

  private failureTable(items: readonly FailItem[]): sql.Table {
    const table = new sql.Table(`${this.schema}.${MSSQL_TABLE_TYPES.failure}`);
    table.columns.add('Id', sql.BigInt, { nullable: false });
    table.columns.add('Token', sql.UniqueIdentifier, { nullable: false });
    table.columns.add('Error', sql.NVarChar(sql.MAX), { nullable: true });
    table.columns.add('Stack', sql.NVarChar(sql.MAX), { nullable: true });
    table.columns.add('DelayMs', sql.Int, { nullable: false });
    table.columns.add('Dead', sql.Bit, { nullable: false });
    table.columns.add('WorkerId', sql.NVarChar(255), { nullable: true });
    for (const item of uniqueById(items)) {
      table.rows.add(
        item.id,
        item.claimToken,
        item.error,
        item.stack,
        Math.min(Math.max(0, Math.round(item.retryDelayMs)), INT_MAX),
        item.dead,
        item.workerId,
      );
    }
    return table;
  }

  /** Give-backs, and postponements (a statement of their own: OwnedJobList has no delay column). */
  async release(items: readonly ReleaseItem[]): Promise<CompleteResult[]> {
    const postponed = items.filter((item) => (item.delayMs ?? 0) > 0);
    const given = items.filter((item) => (item.delayMs ?? 0) <= 0);
    const results: CompleteResult[] = [];
    if (given.length > 0) {
      const rows = await this.run<{ Id: string; Outcome: OwnershipOutcome }>('release', (r) =>
        r.input('items', this.ownedTable(given)),
      );
      results.push(...rows.map((row) => ({ id: row.Id, outcome: row.Outcome })));
    }
    if (postponed.length > 0) {
      const table = this.failureTable(
        postponed.map((item) => ({
          ...item,
          error: '',
          stack: null,
          retryDelayMs: item.delayMs!,
          dead: false,
          workerId: '',
        })),
      );
      const rows = await this.run<{ Id: string; Outcome: OwnershipOutcome }>('postpone', (r) =>
        r.input('items', table),
      );
      results.push(...rows.map((row) => ({ id: row.Id, outcome: row.Outcome })));
    }
    return results;
  }

  async reap(batchSize: number): Promise<ReapedJob[]> {
    const rows = await this.run<{ Id: string; Queue: string; State: 'ready' | 'dead'; Attempt: number }>('reap', (r) =>
      r.input('batch', sql.Int, batchSize),
    );
    return rows.map((row) => ({ id: row.Id, queue: row.Queue, state: row.State, attempt: Number(row.Attempt) }));
  }

  async listBlockedGroups(queue: string, page: { limit: number; afterKey?: string | null }): Promise<BlockedGroupPage> {
    const rows = await this.run<{ GroupKey: string; JobId: string; LastError: string | null; FinishedAt: Date | null }>(
      'listBlockedGroups',
      (r) =>
        r
          .input('queue', sql.NVarChar(128), queue)
          .input('afterKey', sql.NVarChar(255), page.afterKey ?? null)
          .input('limit', sql.Int, page.limit),
    );
    const groups = rows.map((row) => ({
      groupKey: row.GroupKey,
      jobId: row.JobId,
      error: row.LastError ?? null,
      diedAt: row.FinishedAt ?? null,
    }));
    return { groups, nextAfterKey: groups.length === page.limit ? groups[groups.length - 1]!.groupKey : null };
  }

  /**
   * The repair sweep (see findGroupProblems and repairGroup in mssql.queries.ts): one look at up
   * to `limit` group rows and `limit` groups with unfinished jobs, resuming where the last call
   * stopped; then, for what looked wrong, a second look a moment later that fixes only a group
   * whose row did not change in between. Normal operation leaves nothing to fix.
   */
  async repairGroups(limit: number): Promise<GroupRepair[]> {
    type Found = { Kind: string; Queue: string | null; GroupKey: string | null; Version: string | null };
    const rows = await this.run<Found>('findGroupProblems', (r) =>
      r
        .input('rowQueue', sql.NVarChar(128), this.rowSweep?.queue ?? null)
        .input('rowKey', sql.NVarChar(255), this.rowSweep?.key ?? null)
        .input('orphanQueue', sql.NVarChar(128), this.orphanSweep?.queue ?? null)
        .input('orphanKey', sql.NVarChar(255), this.orphanSweep?.key ?? null)
        .input('limit', sql.Int, Math.max(1, Math.min(Math.floor(limit), INT_MAX))),
    );
    const cursor = (kind: string): SweepCursor | null => {
      const row = rows.find((r) => r.Kind === kind);
      return row?.Queue != null && row.GroupKey != null ? { queue: row.Queue, key: row.GroupKey } : null;
    };
    this.rowSweep = cursor('rows');
    this.orphanSweep = cursor('orphans');
    const suspects = rows.filter((r) => (r.Kind === 'row' || r.Kind === 'orphan') && r.Queue && r.GroupKey);
    if (suspects.length === 0) return [];
    await new Promise((resolve) => setTimeout(resolve, REPAIR_RECHECK_MS));
    const repairs: GroupRepair[] = [];
    for (const suspect of suspects) {
      const [fixed] = await this.run<{ Problem: string | null }>('repairGroup', (r) =>
        r
          .input('queue', sql.NVarChar(128), suspect.Queue)
          .input('groupKey', sql.NVarChar(255), suspect.GroupKey)
          .input('version', sql.BigInt, suspect.Kind === 'row' ? suspect.Version : null),
      );
      if (fixed?.Problem) repairs.push({ queue: suspect.Queue!, groupKey: suspect.GroupKey!, problem: fixed.Problem });
    }
    return repairs;
  }

  async pauseQueue(queue: string, reason: string | null): Promise<boolean> {
    const rows = await this.run<Row>('pauseQueue', (r) =>
      r.input('queue', sql.NVarChar(128), queue).input('reason', sql.NVarChar(1000), reason),
    );
    return rows.length > 0;
  }

  async resumeQueue(queue: string): Promise<boolean> {
    const rows = await this.run<Row>('resumeQueue', (r) => r.input('queue', sql.NVarChar(128), queue));
    return rows.length > 0;
  }

  async listPausedQueues(): Promise<QueuePause[]> {
    const rows = await this.run<Row>('listPausedQueues', () => undefined);
    return rows.map((row) => ({
      queue: row.Queue as string,
      reason: (row.Reason as string | null) ?? null,
      pausedAt: row.PausedAt as Date,
    }));
  }

  async cancel(ids: readonly JobId[], reason: string | null): Promise<CancelResult[]> {
    const distinct = [...new Set(ids.map((id) => assertJobId(id)))];
    if (distinct.length === 0) return [];
    const rows = await this.run<{ Id: string; Queue: string | null; Outcome: CancelOutcome; State: JobState | null }>(
      'cancel',
      (r) => r.input('ids', this.idTable(distinct)).input('reason', sql.NVarChar(1000), reason),
    );
    const byId = new Map(rows.map((row) => [row.Id, row]));
    return distinct.map((id) => {
      const row = byId.get(id)!;
      return { id, queue: row.Queue ?? null, outcome: row.Outcome, state: row.State ?? null };
    });
  }

  async findJobByKey(queue: string, idempotencyKey: string): Promise<JobId | null> {
    const rows = await this.run<{ Id: string }>('findJobByKey', (r) =>
      r.input('queue', sql.NVarChar(128), queue).input('key', sql.NVarChar(255), idempotencyKey),
    );
    return rows[0]?.Id ?? null;
  }

  async hasClaimableWork(queue: string): Promise<boolean> {
    const rows = await this.run<{ HasWork: boolean }>('hasClaimableWork', (r) =>
      r.input('queue', sql.NVarChar(128), queue),
    );
    return Boolean(rows[0]?.HasWork);
  }

  async stats(queue: string): Promise<QueueStats> {
    const rows = await this.run<Record<string, string | number | null>>('stats', (r) =>
      r.input('queue', sql.NVarChar(128), queue),
    );
    return toQueueStats(queue, rows[0]!, COLUMNS);
  }

  async queueHealth(request: QueueHealthRequest): Promise<QueueHealth[]> {
    const rows = await this.run<Record<string, string | number | null>>('queueHealth', (r) =>
      r
        .input('windowMs', sql.BigInt, Math.min(Math.max(0, Math.round(request.failureWindowMs)), MAX_OFFSET_MS))
        .input('repeated', sql.Int, Math.min(Math.max(1, Math.round(request.repeatedFailures)), INT_MAX)),
    );
    return rows.map((row) => toQueueHealth(row, COLUMNS));
  }

  async scaleInputs(queue: string): Promise<ScaleInputs> {
    const [row] = await this.run<Row>('scaleInputs', (r) => r.input('Queue', sql.NVarChar(128), queue));
    return toScaleInputs(row!, COLUMNS);
  }

  getJob(id: JobId): Promise<JobRecord | null> {
    return this.readJob('getJob', id);
  }

  private async readJob(statement: 'getJob' | 'getJobAfterWriters', id: JobId): Promise<JobRecord | null> {
    const rows = await this.run<Row>(statement, (r) => r.input('id', sql.BigInt, id));
    return rows[0] ? toJobRecord(rows[0]) : null;
  }

  async getAttempts(id: JobId): Promise<AttemptRecord[]> {
    const rows = await this.run<Row>('getAttempts', (r) => r.input('id', sql.BigInt, id));
    return rows.map((row) => ({
      attempt: Number(row.Attempt),
      outcome: row.Outcome as AttemptRecord['outcome'],
      error: (row.Error as string | null) ?? null,
      stack: (row.Stack as string | null) ?? null,
      workerId: (row.WorkerId as string | null) ?? null,
      startedAt: (row.StartedAt as Date | null) ?? null,
      finishedAt: row.FinishedAt as Date,
    }));
  }

  async listDead(queue: string, page: { limit: number; afterId?: JobId | null }): Promise<DeadJobPage> {
    const rows = await this.run<Row>('listDead', (r) =>
      r
        .input('queue', sql.NVarChar(128), queue)
        .input('afterId', sql.BigInt, page.afterId ?? null)
        .input('limit', sql.Int, page.limit),
    );
    const jobs = rows.map(toJobRecord);
    return { jobs, nextAfterId: jobs.length === page.limit ? jobs[jobs.length - 1]!.id : null };
  }

  async retryDead(queue: string, ids: readonly JobId[] | 'all'): Promise<JobId[]> {
    if (ids === 'all') {
      // Keyset batches in Id order, each its own autocommit statement (see SET_BATCH).
      const retried: JobId[] = [];
      for (let afterId = '0'; ;) {
        const rows = await this.run<{ Id: string }>('retryAllDead', (r) =>
          r
            .input('queue', sql.NVarChar(128), queue)
            .input('afterId', sql.BigInt, afterId)
            .input('batch', sql.Int, SET_BATCH),
        );
        retried.push(...rows.map((row) => row.Id));
        if (rows.length < SET_BATCH) return retried;
        afterId = rows[rows.length - 1]!.Id;
      }
    }
    if (ids.length === 0) return [];
    const rows = await this.run<{ Id: string }>('retryDead', (r) =>
      r.input('queue', sql.NVarChar(128), queue).input('ids', this.idTable(ids)),
    );
    return rows.map((row) => row.Id);
  }

  private idTable(ids: Iterable<JobId>): sql.Table {
    const table = new sql.Table(`${this.schema}.${MSSQL_TABLE_TYPES.ids}`);
    table.columns.add('Id', sql.BigInt, { nullable: false });
    for (const id of new Set(ids)) table.rows.add(id);
    return table;
  }

  /**
   * All of a queue's dead jobs (or those dead longer than `olderThanMs`) in statements of
   * SET_BATCH rows; with `ids`, only those of them, in statements of SET_BATCH ids.
   */
  async purgeDead(queue: string, options?: { olderThanMs?: number; ids?: readonly JobId[] }): Promise<number> {
    const olderThanMs = Math.min(options?.olderThanMs ?? 0, MAX_OFFSET_MS);
    const bind = (batch: number) => (r: sql.Request) =>
      r
        .input('queue', sql.NVarChar(128), queue)
        .input('olderThanMs', sql.BigInt, olderThanMs)
        .input('batch', sql.Int, batch);
    let total = 0;
    if (options?.ids) {
      const ids = [...new Set(options.ids.map((id) => assertJobId(id)))];
      for (let from = 0; from < ids.length; from += SET_BATCH) {
        const chunk = ids.slice(from, from + SET_BATCH);
        const rows = await this.run<{ Deleted: number }>('purgeDeadIds', (r) =>
          bind(chunk.length)(r).input('ids', this.idTable(chunk)),
        );
        total += Number(rows[0]?.Deleted ?? 0);
      }
      return total;
    }
    for (;;) {
      const rows = await this.run<{ Deleted: number }>('purgeDead', bind(SET_BATCH));
      const deleted = Number(rows[0]?.Deleted ?? 0);
      total += deleted;
      if (deleted < SET_BATCH) return total;
    }
  }

  /**
   * One statement (see listReadyJobs … in mssql.queries.ts): the page and one more row, which
   * says whether a next page exists, or the last entry a bounded grouped read took; a job that
   * changed state meanwhile is left out of the page but still places the next one.
   */
  async listJobs(request: JobListRequest): Promise<JobListPage> {
    const { queue, state, limit, after } = checkJobListRequest(request);
    const [rows = [], [totals] = []] = await this.runForResults(JOB_LIST_STATEMENTS[state], (r) =>
      r
        .input('queue', sql.NVarChar(128), queue)
        .input('limit', sql.Int, limit)
        .input('part', sql.TinyInt, after === null ? null : after.part === 'grouped' ? 2 : 1)
        .input('keyInt', sql.Int, after?.priority ?? null)
        .input('keyAt', sql.DateTime2(3), after?.time ? new Date(after.time) : null)
        .input('keyText', sql.NVarChar(255), after?.groupKey ?? null)
        .input('keyId', sql.BigInt, after?.id ?? null),
    );
    const { page, last } = splitJobListRows(
      rows,
      limit,
      (row) => row.ScanEnd === true,
      (row) => row.Found === true,
    );
    const nextCursor = last ? encodeJobListCursor({ queue, state }, positionOf(last)) : null;
    // Done: the look-up reached its bound and no page follows; older done jobs may exist.
    const scanLimited = nextCursor === null && Number(totals?.Scanned ?? 0) >= DONE_SCAN_LIMIT;
    return { jobs: page.filter((row) => row.Found).map(toJobSummary), nextCursor, scanLimited };
  }

  /** One batch for every queue (recordThroughput in mssql.queries.ts); nothing for no counts. */
  async recordThroughput(counts: readonly ThroughputCount[]): Promise<void> {
    const sums = sumThroughputByQueue(counts);
    if (sums.length === 0) return;
    const table = new sql.Table(`${this.schema}.${MSSQL_TABLE_TYPES.throughputCounts}`);
    table.columns.add('Queue', sql.NVarChar(128), { nullable: false });
    for (const column of ['Completed', 'Failed', 'Dead', 'BusyMs'])
      table.columns.add(column, sql.BigInt, { nullable: false });
    for (const sum of sums) table.rows.add(sum.queue, sum.completed, sum.failed, sum.dead, sum.busyMs ?? 0);
    await this.run('recordThroughput', (r) => r.input('counts', table));
  }

  async readThroughput(minutes: number): Promise<ThroughputReading> {
    assertThroughputMinutes(minutes);
    const [[clock] = [], buckets = []] = await this.runForResults('readThroughput', (r) =>
      r.input('minutes', sql.Int, minutes),
    );
    // bigint columns come back as strings.
    return {
      now: clock!.Now as Date,
      buckets: buckets.map((b) => ({
        minute: b.Minute as Date,
        queue: b.Queue as string,
        completed: Number(b.Completed),
        failed: Number(b.Failed),
        dead: Number(b.Dead),
      })),
    };
  }

  /**
   * Up to `batchSize` rows (retention allows up to 100,000), as statements of at most SET_BATCH
   * rows each, every one its own autocommit transaction; stops at the first short statement.
   */
  async cleanup(request: CleanupRequest): Promise<number> {
    let total = 0;
    while (total < request.batchSize) {
      const batch = Math.min(SET_BATCH, request.batchSize - total);
      const rows = await this.run<{ Deleted: number }>('cleanup', (r) =>
        r
          .input('doneMs', sql.BigInt, Math.min(request.doneRetentionMs, MAX_OFFSET_MS))
          .input('keyMs', sql.BigInt, Math.min(request.idempotencyRetentionMs, MAX_OFFSET_MS))
          .input(
            'deadMs',
            sql.BigInt,
            request.deadRetentionMs === null ? null : Math.min(request.deadRetentionMs, MAX_OFFSET_MS),
          )
          .input('batch', sql.Int, batch),
      );
      const deleted = Number(rows[0]?.Deleted ?? 0);
      total += deleted;
      if (deleted < batch) break;
    }
    await this.run('cleanupThroughput', (r) =>
      r
        .input('retentionMs', sql.BigInt, THROUGHPUT_RETENTION_MS)
        .input('batch', sql.Int, Math.min(SET_BATCH, request.batchSize)),
    );
    await this.run('cleanupFlowState', (r) => r.input('batch', sql.Int, Math.min(SET_BATCH, request.batchSize)));
    return total;
  }

  async scheduleDueIn(): Promise<{ now: Date; dueInMs: number | null }> {
    const [row] = await this.run<{ Now: Date; DueInMs: string | number | null }>('scheduleDueIn', () => undefined);
    return { now: row!.Now, dueInMs: row!.DueInMs === null ? null : Number(row!.DueInMs) };
  }

  /**
   * One transaction of the store's own (READ COMMITTED, as migrate opens one): the due schedules
   * are locked (scheduleLockDue), `plan` decides from them and the database's now, the firings'
   * jobs go through enqueue's own path with this transaction (as a caller's transaction: a
   * tick's idempotency key already in its queue returns the existing job under the key's lock,
   * so a repeated tick never fails the round, and grouped jobs join their groups), the
   * schedules advance, and it commits. Any error rolls it all back (nothing fired) and is
   * rethrown; a deadlock victim's transaction is already rolled back by the server. No retry
   * here: the scheduler's next round fires what this one did not.
   */
  async fireDueSchedules(
    limit: number,
    plan: (rows: readonly ScheduleRow[], now: Date) => ScheduleFiring[],
  ): Promise<ScheduleFiring[]> {
    const pool = await this.connected();
    const transaction = new sql.Transaction(pool);
    await transaction.begin(sql.ISOLATION_LEVEL.READ_COMMITTED);
    try {
      const locked = await this.run<Row & { Now: Date }>(
        'scheduleLockDue',
        (r) => r.input('limit', sql.Int, Math.max(1, Math.min(Math.floor(limit), INT_MAX))),
        transaction,
      );
      if (locked.length === 0) {
        await transaction.commit();
        return [];
      }
      const now = locked[0]!.Now;
      const rows = locked.map((row) => toScheduleRow(row, COLUMNS));
      const firings = plan(rows, now);
      const lockedIds = new Set(rows.map((row) => row.id));
      const stray = firings.find((firing) => !lockedIds.has(firing.id));
      // Firing a schedule this transaction does not hold could fire a tick twice.
      if (stray) throw new Error(`the firing plan named schedule '${stray.id}', which this round did not lock`);
      const jobs = firings.flatMap((firing) => firing.jobs);
      // One statement for every queue: the bulk enqueue takes each job's queue from its row.
      if (jobs.length > 0) await this.enqueue(jobs, transaction);
      if (firings.length > 0) {
        const table = new sql.Table(`${this.schema}.${MSSQL_TABLE_TYPES.scheduleAdvance}`);
        table.columns.add('Id', sql.NVarChar(128), { nullable: false });
        table.columns.add('NextRunAt', sql.DateTime2(3), { nullable: true });
        table.columns.add('LastTick', sql.DateTime2(3), { nullable: true });
        table.columns.add('Fired', sql.Bit, { nullable: false });
        for (const firing of uniqueById(firings)) {
          table.rows.add(firing.id, firing.nextRunAt, firing.lastTick, firing.jobs.length > 0);
        }
        await this.run(
          'scheduleAdvance',
          (r) => r.input('items', table).input('now', sql.DateTime2(3), now),
          transaction,
        );
      }
      await transaction.commit();
      return firings;
    } catch (error) {
      await transaction.rollback().catch(() => undefined);
      throw error;
    }
  }

  /**
   * One batch, in a transaction of its own (scheduleUpsert): the ids' application locks, then
   * update or insert, then the prune. A repeated id keeps its last entry (one row per id in the
   * table type). Retried in place on a deadlock or refused lock, like every store statement.
   */
  async upsertSchedules(items: readonly ScheduleUpsert[], pruneSource?: ScheduleSource): Promise<void> {
    const byId = new Map(items.map((item) => [item.id, item]));
    if (byId.size === 0 && pruneSource === undefined) return;
    const table = new sql.Table(`${this.schema}.${MSSQL_TABLE_TYPES.scheduleUpsert}`);
    table.columns.add('Id', sql.NVarChar(128), { nullable: false });
    table.columns.add('Queue', sql.NVarChar(128), { nullable: false });
    table.columns.add('Cron', sql.NVarChar(256), { nullable: false });
    table.columns.add('Timezone', sql.NVarChar(128), { nullable: false });
    table.columns.add('Payload', sql.NVarChar(sql.MAX), { nullable: false });
    table.columns.add('Options', sql.NVarChar(sql.MAX), { nullable: false });
    table.columns.add('CatchUp', sql.VarChar(4), { nullable: false });
    table.columns.add('Source', sql.VarChar(7), { nullable: false });
    table.columns.add('NextRunAt', sql.DateTime2(3), { nullable: true });
    for (const item of byId.values()) {
      table.rows.add(
        item.id,
        item.queue,
        item.cron,
        item.timezone,
        item.payload,
        item.options,
        item.catchUp,
        item.source,
        item.nextRunAt,
      );
    }
    await this.run('scheduleUpsert', (r) =>
      r.input('items', table).input('prune', sql.VarChar(7), pruneSource ?? null),
    );
  }

  async getSchedule(id: string): Promise<ScheduleRow | null> {
    const rows = await this.run<Row>('scheduleGet', (r) => r.input('id', sql.NVarChar(128), id));
    return rows[0] ? toScheduleRow(rows[0], COLUMNS) : null;
  }

  async listSchedules(): Promise<ScheduleRow[]> {
    const rows = await this.run<Row>('scheduleList', () => undefined);
    return rows.map((row) => toScheduleRow(row, COLUMNS));
  }

  async deleteSchedule(id: string): Promise<boolean> {
    const rows = await this.run<{ Existed: boolean }>('scheduleDelete', (r) => r.input('id', sql.NVarChar(128), id));
    return Boolean(rows[0]?.Existed);
  }

  async setSchedulePaused(id: string, paused: boolean, nextRunAt: Date | null): Promise<boolean> {
    const rows = await this.run<{ Existed: boolean }>('schedulePause', (r) =>
      r
        .input('id', sql.NVarChar(128), id)
        .input('paused', sql.Bit, paused)
        .input('nextRunAt', sql.DateTime2(3), nextRunAt),
    );
    return Boolean(rows[0]?.Existed);
  }

  async ping(timeoutMs: number): Promise<void> {
    await withTimeout(
      this.connected().then((pool) => pool.request().query(this.sql.ping)),
      timeoutMs,
      'database ping',
    );
  }

  isTransientError(error: unknown): boolean {
    return isTransientMssqlError(error);
  }

  isRefusal(error: unknown): boolean {
    return isMssqlRefusal(error);
  }

  async close(): Promise<void> {
    if (!this.ownsPool) return;
    this.closed = true;
    await this.pool.close();
  }

  /**
   * Runs one named statement. On the store's own connections a deadlock or lock timeout is
   * retried a few times. Each statement of a batch runs in autocommit or in the batch's own
   * transaction, so the failed statement was rolled back whole, though earlier statements of
   * the same batch may have committed (cleanup's DELETEs, complete's UPDATE before its SELECT):
   * every batch is written so that running it again is safe (deletes find fewer rows, a second
   * completion answers 'already'). In a caller's transaction the error is
   * rethrown: the server rolled back the caller's work, which only the caller can redo.
   * request.query() is sent as sp_executesql, so the SET options each batch opens with revert
   * when it ends (see MSSQL_STORE_SESSION).
   */
  private async run<R>(name: keyof MssqlQueries, bind: Bind, transaction: sql.Transaction | null = null): Promise<R[]> {
    return ((await this.send<R>(name, bind, transaction)).recordset ?? []) as R[];
  }

  /** run() for a batch that returns more than one result: each, in order. */
  private async runForResults(name: keyof MssqlQueries, bind: Bind): Promise<Row[][]> {
    return ((await this.send<Row>(name, bind, null)).recordsets ?? []) as Row[][];
  }

  /** The round trip of run() and runForResults(), with run()'s retry. */
  private async send<R>(
    name: keyof MssqlQueries,
    bind: Bind,
    transaction: sql.Transaction | null,
  ): Promise<sql.IResult<R>> {
    const pool = transaction ? null : await this.connected();
    for (let attempt = 1; ; attempt++) {
      const request = transaction ? new sql.Request(transaction) : pool!.request();
      bind(request);
      try {
        return await request.query<R>(this.sql[name]);
      } catch (error) {
        if (errorNumber(error) === MSSQL_OPEN_TRANSACTION) {
          throw new SqlQueueTransactionError(
            `${name} refused: the store's connection has an open transaction (left open on a shared pool?); the store runs ${name} in autocommit so its locks end with the statement`,
            { cause: error },
          );
        }
        if (errorNumber(error) === MSSQL_NO_STORE_TRANSACTION) {
          throw new SqlQueueTransactionError(
            `${name} refused: it runs in the store's own transaction, and its connection had none (mssql handed the request a connection outside the transaction?)`,
            { cause: error },
          );
        }
        if (errorNumber(error) === MSSQL_NESTED_OWN_TRANSACTION) throw nestedOwnTransaction(name, error);
        if (errorNumber(error) === MSSQL_CALLER_TRANSACTION_GONE) {
          throw new SqlQueueTransactionError(
            'enqueue refused: the transaction passed in is no longer open on the server (an earlier error rolled it back?); the job would have committed without your work',
            { cause: error },
          );
        }
        if (transaction || attempt >= LOCK_CONFLICT_RETRIES || !isLockConflict(error)) throw error;
        await new Promise((resolve) => setTimeout(resolve, 5 + Math.random() * 20 * attempt));
      }
    }
  }
}

/** The refusal of MSSQL_OWN_TRANSACTION_GUARD, for the store's and the broker transport's own transactions. */
export function nestedOwnTransaction(what: string, cause: unknown): SqlQueueTransactionError {
  return new SqlQueueTransactionError(
    `${what} refused: the transaction it began is nested in one its pooled connection already had (an application left a transaction open, or IMPLICIT_TRANSACTIONS ON, on the shared pool); its commit would have committed nothing`,
    { cause },
  );
}

/** mssql 12 accepts a per-request timeout as a second constructor argument; its types lag behind. */
function requestWithTimeout(parent: sql.Transaction, requestTimeout: number): sql.Request {
  const RequestWithOverrides = sql.Request as unknown as new (
    parent: sql.Transaction,
    overrides: { requestTimeout: number },
  ) => sql.Request;
  return new RequestWithOverrides(parent, { requestTimeout });
}

/** The table types key on Id; a repeated id in one call keeps its first entry (as the engine never repeats one). */
function uniqueById<T extends { id: string }>(items: readonly T[]): T[] {
  const seen = new Set<string>();
  return items.filter((item) => !seen.has(item.id) && seen.add(item.id));
}

function bindOne(job: NewJob): Bind {
  return (request) =>
    request
      .input('queue', sql.NVarChar(128), job.queue)
      .input('payload', sql.NVarChar(sql.MAX), job.payload)
      .input('priority', sql.Int, job.priority)
      .input('runAt', sql.DateTime2(3), job.runAt)
      .input('delayMs', sql.BigInt, job.delayMs)
      .input('groupKey', sql.NVarChar(255), job.groupKey)
      .input('idempotencyKey', sql.NVarChar(255), job.idempotencyKey)
      .input('maxAttempts', sql.Int, job.maxAttempts)
      .input('defaultMaxAttempts', sql.Int, job.defaultMaxAttempts)
      .input('traceContext', sql.VarChar(MAX_TRACE_CONTEXT_LENGTH), job.traceContext ?? null)
      .input('concurrencyKey', sql.NVarChar(255), job.concurrencyKey);
}

/** The caller's transaction: an mssql Transaction on which begin() was awaited. */
export function asCallerTransaction(transaction: unknown): sql.Transaction {
  if (transaction instanceof sql.Transaction) return transaction;
  const candidate = transaction as { begin?: unknown; commit?: unknown; rollback?: unknown; request?: unknown } | null;
  if (
    candidate &&
    typeof candidate.begin === 'function' &&
    typeof candidate.commit === 'function' &&
    typeof candidate.request === 'function'
  ) {
    return candidate as unknown as sql.Transaction;
  }
  throw new SqlQueueValidationError(
    'transaction must be an mssql Transaction on which begin() was awaited (new sql.Transaction(pool))',
  );
}

function toClaimedJob(row: Row): ClaimedJob {
  return {
    id: row.Id as string,
    queue: row.Queue as string,
    payload: JSON.parse(row.Payload as string),
    priority: Number(row.Priority),
    groupKey: (row.GroupKey as string | null) ?? null,
    idempotencyKey: (row.IdempotencyKey as string | null) ?? null,
    attempt: Number(row.Attempts),
    maxAttempts: Number(row.MaxAttempts),
    claimToken: (row.ClaimToken as string).toLowerCase(),
    enqueuedAt: row.CreatedAt as Date,
    claimedAt: row.ClaimedAt as Date,
    leaseUntil: row.LeaseUntil as Date,
    traceContext: (row.TraceContext as string | null) ?? null,
  };
}

function toJobRecord(row: Row): JobRecord {
  return {
    ...jobFields(row, COLUMNS),
    payload: JSON.parse(row.Payload as string),
    claimToken: row.ClaimToken ? (row.ClaimToken as string).toLowerCase() : null,
    lastError: (row.LastError as string | null) ?? null,
    cancelRequestedAt: (row.CancelRequestedAt as Date | null) ?? null,
    concurrencyKey: (row.ConcurrencyKey as string | null) ?? null,
    cancelReason: (row.CancelReason as string | null) ?? null,
    result: row.Result === null || row.Result === undefined ? null : JSON.parse(row.Result as string),
    progress: row.Progress === null || row.Progress === undefined ? null : JSON.parse(row.Progress as string),
  };
}

/** Where the listing stops after `row`: the sort key @page kept for it (see listedJobs in mssql.queries.ts). */
function positionOf(row: Row): JobListPosition {
  return {
    part: row.Part === 2 ? 'grouped' : 'ungrouped',
    id: row.Id as string,
    priority: row.KeyInt === null ? null : Number(row.KeyInt),
    // datetime2(3): the Date holds the key exactly.
    time: row.KeyAt === null ? null : (row.KeyAt as Date).toISOString(),
    groupKey: (row.KeyText as string | null) ?? null,
  };
}

/**
 * LEFT counts UTF-16 code units under a collation that is not supplementary-aware, so a preview
 * can end with the first half of a surrogate pair: it is dropped, and the preview stays
 * well-formed text.
 */
function wholeCharacters(text: string): string {
  return /[\uD800-\uDBFF]$/.test(text) ? text.slice(0, -1) : text;
}

function toJobSummary(row: Row): JobSummary {
  const lastError = (row.LastErrorPreview as string | null) ?? null;
  return {
    ...jobFields(row, COLUMNS),
    payloadPreview: wholeCharacters(row.PayloadPreview as string),
    lastErrorPreview: lastError === null ? null : wholeCharacters(lastError),
  };
}
