import { SqlQueueValidationError } from '../../core/errors.js';
import {
  checkJobListRequest,
  encodeJobListCursor,
  splitJobListRows,
  type JobListPosition,
  JOB_LIST_STATEMENTS,
} from '../../core/listing/index.js';
import { assertThroughputMinutes, sumThroughputByQueue } from '../../core/throughput/index.js';
import { assertJobId } from '../../core/producer/index.js';
import { FlowRouting } from '../flow-routing.js';
import {
  flowKeysToWalk,
  type HandlerTransaction,
  type MigrationMode,
  type QueueStore,
  type SchemaStatus,
} from '../../core/queue-store.js';
import { openTransaction } from '../open-transaction.js';
import type { ScaleInputs } from '../../core/scaling/index.js';
import { assertSchemaVersion } from '../../core/maintenance/index.js';
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
  GroupRepair,
  HeartbeatItem,
  HeartbeatResult,
  JobId,
  JobListPage,
  JobListRequest,
  JobRecord,
  FlowUsage,
  JobState,
  ListedJobState,
  JobSummary,
  NewJob,
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
import { DONE_SCAN_LIMIT, JOB_PREVIEW_CHARS, THROUGHPUT_RETENTION_MS } from '../../core/types.js';
import type {
  ScheduleFiring,
  ScheduleRow,
  ScheduleSource,
  ScheduleStore,
  ScheduleUpsert,
} from '../../core/schedules/index.js';
import { assertSchemaName, settingsByQueue } from '../../core/validation.js';
import { settleWithin, withTimeout } from '../../core/timeout.js';
import { asCallerTransaction, endingClient, type PgDriver, type PgQueryable } from './postgres.driver.js';
import { isPgRefusal, isTransientPgError } from './postgres.errors.js';
import { PG_LATEST_VERSION, PG_MIGRATIONS, pgBootstrap, pgMigrationLockKey } from './postgres.migrations.js';
import { pgQueries, type PgQueries } from './postgres.queries.js';
import { pgSchemaDigest, pgWakeChannel } from './postgres.identifiers.js';
import {
  type Columns,
  jobFields,
  newJobValues,
  snakeCaseColumns,
  toQueueHealth,
  toFlowUsage,
  toScaleInputs,
  toQueueStats,
  toScheduleRow,
} from '../rows.js';

const COLUMNS: Columns = snakeCaseColumns();
const PURGE_BATCH = 5_000;
const IDEMPOTENT_ENQUEUE_ROUNDS = 3;
/** Rounds of touchGroups before giving up: each lost round is a group created or deleted meanwhile. */
const GROUP_TOUCH_ROUNDS = 5;
/** Retries of a group a producer still held: backoff bounds, and how long to keep trying. */
const SETTLE_RETRY_MIN_MS = 50;
const SETTLE_RETRY_MAX_MS = 2_000;
const SETTLE_RETRY_FOR_MS = 600_000;
/** Emptied groups settled per pair of statements. */
const SETTLE_BATCH = 1_000;
/** The repair sweep waits at most this long on a row lock before leaving a page for a later pass. */
const REPAIR_LOCK_TIMEOUT_MS = 2_000;

/** An ordered group, as the group statements take it in json. */
interface GroupRef {
  queue: string;
  key: string;
}

/** A position of the repair sweep: the last group checked, or null to start over. */
type SweepCursor = { queue: string; key: string } | null;

type Row = Record<string, unknown>;

export class PostgresQueueStore implements QueueStore, ScheduleStore {
  readonly dialect = 'postgres';

  get poolSize(): number | null {
    return this.driver.poolSize;
  }

  get singleSession(): boolean {
    return this.driver.kind === 'pglite';
  }
  private readonly sql: PgQueries;
  /** Prepared-statement names are per schema, since the statement text embeds the schema. */
  private readonly prepared: (name: keyof PgQueries) => string;
  /** Wake-up channel: one per schema, payload = queue name. */
  readonly channel: string;
  /** Emptied groups a producer still held, tried again after a backoff. */
  private readonly settleRetries = new Map<string, { group: GroupRef; delayMs: number; since: number }>();
  private settleTimer: ReturnType<typeof setTimeout> | null = null;
  /** Emptied groups to settle, and the loop settling them. */
  private readonly toSettle = new Map<string, GroupRef>();
  private settlingNow: Promise<void> | null = null;
  private readonly flowRouting = new FlowRouting();
  private closed = false;
  private rowSweep: SweepCursor = null;
  private orphanSweep: SweepCursor = null;

  constructor(
    private readonly driver: PgDriver,
    readonly schema: string,
  ) {
    assertSchemaName(schema);
    this.sql = pgQueries(schema);
    // PostgreSQL keeps 63 bytes of a name: statement names use a digest of the schema's.
    const digest = pgSchemaDigest(schema);
    this.prepared = (name) => `sqlqueue_${digest}_${name}`;
    this.channel = pgWakeChannel(schema);
  }

  async migrate(mode: MigrationMode): Promise<SchemaStatus> {
    if (mode === 'off') return { current: -1, latest: PG_LATEST_VERSION };
    // 'check', or already current: nothing to install, so no lock and no DDL (an application
    // login without CREATE rights boots with the default 'auto' once a DBA installed the schema).
    const installed = await this.readVersion(this.driver);
    if (mode === 'check' || installed >= PG_LATEST_VERSION) {
      assertSchemaVersion('postgres', this.schema, installed, PG_LATEST_VERSION, mode);
      return { current: installed, latest: PG_LATEST_VERSION };
    }
    return this.driver.transaction(async (client) => {
      // Transaction-scoped: released by COMMIT or ROLLBACK even if this process dies.
      await client.query('SELECT pg_advisory_xact_lock(hashtext($1))', [pgMigrationLockKey(this.schema)]);
      for (const statement of pgBootstrap(this.schema)) await client.query(statement);
      const current = await this.readVersion(client);
      assertSchemaVersion('postgres', this.schema, current, PG_LATEST_VERSION, 'auto');
      for (const migration of PG_MIGRATIONS.filter((m) => m.version > current)) {
        for (const statement of migration.statements(this.schema)) await client.query(statement);
        await client.query(`INSERT INTO ${this.versionTable()} (version, description) VALUES ($1, $2)`, [
          migration.version,
          migration.description,
        ]);
      }
      return { current: PG_LATEST_VERSION, latest: PG_LATEST_VERSION };
    });
  }

  private versionTable(): string {
    return `"${this.schema}".schema_version`;
  }

  private async readVersion(client: PgQueryable): Promise<number> {
    const exists = await client.query<{ present: boolean }>('SELECT to_regclass($1) IS NOT NULL AS present', [
      `"${this.schema}".schema_version`,
    ]);
    if (!exists.rows[0]?.present) return 0;
    const result = await client.query<{ version: number | null }>(
      `SELECT max(version) AS version FROM ${this.versionTable()}`,
    );
    return Number(result.rows[0]?.version ?? 0);
  }

  async enqueue(jobs: readonly NewJob[], transaction?: unknown): Promise<EnqueueResult[]> {
    if (jobs.length === 0) return [];
    return this.enqueueOn(jobs, transaction === undefined ? null : asCallerTransaction(transaction));
  }

  /** The enqueue path, on a transaction's client (the caller's or ours), or autocommit with null. */
  private async enqueueOn(jobs: readonly NewJob[], client: PgQueryable | null): Promise<EnqueueResult[]> {
    const grouped = jobs.some((job) => job.groupKey !== null);
    // Several jobs with keys take more than one statement (the insert, then a look-up of the keys
    // that conflicted): in autocommit the insert would commit alone, and a failed look-up would
    // leave stored jobs behind an error (a caller, or the batcher, sending them again would store
    // them twice). So they run in one transaction, as grouped jobs do for their group's state.
    const keyedBatch = jobs.length > 1 && jobs.some((job) => job.idempotencyKey !== null);
    if (!grouped && (client !== null || !keyedBatch)) return this.insertJobs(jobs, client);
    // A grouped job and its group's state commit together: in the caller's transaction, or in one
    // of ours (a job committed without its group state would wait for the repair sweep).
    const work = async (tx: PgQueryable) => {
      const results = await this.insertJobs(jobs, tx);
      if (grouped) await this.touchGroups(tx, groupHeads(jobs, results));
      return results;
    };
    return client ? work(client) : this.driver.transaction(work);
  }

  private async insertJobs(jobs: readonly NewJob[], client: PgQueryable | null): Promise<EnqueueResult[]> {
    if (jobs.length === 1) return [await this.enqueueOne(jobs[0]!, client)];

    const uniform = uniformParams(jobs);
    if (uniform) {
      const rows = await this.run<{ id: string }>(client, 'enqueueManyUniform', uniform);
      return rows.map((row) => ({ jobId: row.id, created: true }));
    }
    const results: (EnqueueResult | undefined)[] = new Array(jobs.length);
    let pending = jobs.map((job, ord) => ({ job, ord }));
    for (let round = 0; pending.length > 0 && round < IDEMPOTENT_ENQUEUE_ROUNDS; round++) {
      const rows = await this.run<{ ord: number; id: string; created: boolean }>(
        client,
        'enqueueMany',
        enqueueManyParams(pending.map(({ job }) => job)),
      );
      const conflicts: { job: NewJob; ord: number }[] = [];
      for (const row of rows) {
        const item = pending[row.ord]!;
        if (row.created) results[item.ord] = { jobId: row.id, created: true };
        else conflicts.push(item);
      }
      pending = await this.resolveExisting(conflicts, results, client);
    }
    if (pending.length > 0) throw new Error('idempotent enqueue did not settle: keys kept being deleted');
    return results as EnqueueResult[];
  }

  private async enqueueOne(job: NewJob, client: PgQueryable | null): Promise<EnqueueResult> {
    for (let round = 0; round < IDEMPOTENT_ENQUEUE_ROUNDS; round++) {
      const rows = await this.run<{ id: string }>(client, 'enqueueOne', [...newJobValues(job), job.concurrencyKey]);
      if (rows[0]) return { jobId: rows[0].id, created: true };
      const results: (EnqueueResult | undefined)[] = [undefined];
      await this.resolveExisting([{ job, ord: 0 }], results, client);
      if (results[0]) return results[0];
    }
    throw new Error('idempotent enqueue did not settle: the key kept being deleted');
  }

  async recordQueueSettings(settings: readonly QueueSetting[]): Promise<void> {
    const rows = settingsByQueue(settings).map((setting) => ({
      queue: setting.queue,
      max_attempts: setting.maxAttempts,
      group_on_dead: setting.groupOnDead ?? 'continue',
      global_concurrency: setting.limits?.globalConcurrency ?? null,
      concurrency_per_key: setting.limits?.concurrencyPerKey ?? null,
      rate_max: setting.limits?.rateLimit?.max ?? null,
      rate_per_ms: setting.limits?.rateLimit?.perMs ?? null,
      key_rate_max: setting.limits?.rateLimitPerKey?.max ?? null,
      key_rate_per_ms: setting.limits?.rateLimitPerKey?.perMs ?? null,
    }));
    if (rows.length > 0) await this.run(null, 'recordQueueSettings', [JSON.stringify(rows)]);
  }

  /**
   * Conflicting keys name a job that committed before ours (ON CONFLICT waited for it), so a
   * new statement sees it. If it was deleted meanwhile, the caller inserts again.
   */
  private async resolveExisting(
    conflicts: { job: NewJob; ord: number }[],
    results: (EnqueueResult | undefined)[],
    client: PgQueryable | null,
  ): Promise<{ job: NewJob; ord: number }[]> {
    if (conflicts.length === 0) return [];
    const rows = await this.run<{ queue: string; idempotency_key: string; id: string }>(
      client,
      'findByIdempotencyKeys',
      [JSON.stringify(conflicts.map(({ job }) => ({ queue: job.queue, key: job.idempotencyKey })))],
    );
    const found = new Map(rows.map((row) => [`${row.queue}\u0000${row.idempotency_key}`, row.id]));
    const missing: { job: NewJob; ord: number }[] = [];
    for (const item of conflicts) {
      const id = found.get(`${item.job.queue}\u0000${item.job.idempotencyKey}`);
      if (id === undefined) missing.push(item);
      else results[item.ord] = { jobId: id, created: false };
    }
    return missing;
  }

  async claim(request: ClaimRequest): Promise<ClaimedJob[]> {
    return this.flowRouting.claim(
      request,
      async (ordinary) => {
        const rows = await this.run<Row>(null, 'claim', this.claimParams(ordinary, ordinary.limit, false));
        const claimed = toClaimedJobs(ordinary.queue, rows);
        // The statement's marker row says the queue is the flow claim's (flow-routing.ts).
        return { claimed, handOver: claimed.length < rows.length };
      },
      (flow) => this.flowClaim(flow),
    );
  }

  claimRetryHintMs(queue: string): number | null {
    return this.flowRouting.retryHintMs(queue);
  }

  async flowUsage(queue: string, top: number): Promise<FlowUsage> {
    const [row] = await this.run<Row>(null, 'flowUsage', [queue, top]);
    return toFlowUsage(queue, row, COLUMNS);
  }

  private claimParams(request: ClaimRequest, limit: number, flow: boolean): unknown[] {
    return [request.queue, limit, request.leaseMs, request.workerId, request.groupBatchSize ?? 1, flow];
  }

  /**
   * The claim of a queue with flow limits or concurrency keys (flow.queries.ts): one transaction
   * holding the queue's flow lock, so that the counts it leases against are exact.
   */
  private async flowClaim(request: ClaimRequest): Promise<ClaimedJob[]> {
    const { queue } = request;
    return this.driver.transaction(async (client) => {
      if ((await this.runInOwn(client, 'flowLock', [queue])).length === 0) {
        await this.runInOwn(client, 'flowLockCreate', [queue]);
        await this.runInOwn(client, 'flowLock', [queue]);
      }
      const [budget] = await this.runInOwn<FlowBudgetRow>(client, 'flowBudget', [queue]);
      if (!budget || budget.paused) return [];
      let room = request.limit;
      if (budget.global_concurrency !== null) room = Math.min(room, budget.global_concurrency - (budget.running ?? 0));
      const windowFull = budget.rate_max !== null && budget.rate_max - (budget.recent_starts ?? 0) <= 0;
      this.flowRouting.noteRateWindow(queue, windowFull ? (budget.rate_free_in_ms ?? 0) : null);
      if (windowFull) return [];
      if (budget.rate_max !== null) room = Math.min(room, budget.rate_max - (budget.recent_starts ?? 0));
      if (room <= 0) return [];
      // Jobs without a key (and ordered groups) are one more lane in the turn: all the room when
      // no keyed job waits, else one job a claim, as a key gets in a round.
      const claimPlain = async (limit: number) =>
        toClaimedJobs(queue, await this.runInOwn<Row>(client, 'claim', this.claimParams(request, limit, true)));
      const share = budget.keyed_work ? 1 : room;
      const plain = budget.plain_work ? await claimPlain(share) : [];
      const left = room - plain.length;
      const perMs = budget.rate_per_ms;
      if (!budget.keyed_work || left <= 0) {
        if (perMs !== null && plain.length > 0) {
          await this.runInOwn(client, 'flowRecordStarts', [queue, budget.at, plain.length, perMs]);
        }
        return plain;
      }
      const keyed = await this.runInOwn<Row>(client, 'flowLease', [
        queue,
        left,
        request.leaseMs,
        request.workerId,
        budget.at,
        flowKeysToWalk(left),
        budget.concurrency_per_key,
        budget.key_rate_max,
        budget.key_rate_per_ms,
        plain.length,
        perMs,
      ]);
      // Room the keys could not use (at their limits, or too few) goes back to the jobs without one.
      const unused = left - keyed.length;
      const more = unused > 0 && plain.length === share ? await claimPlain(unused) : [];
      if (perMs !== null && more.length > 0) {
        await this.runInOwn(client, 'flowRecordStarts', [queue, budget.at, more.length, perMs]);
      }
      return [...plain, ...toClaimedJobs(queue, keyed), ...more];
    });
  }

  async heartbeat(items: readonly HeartbeatItem[]): Promise<HeartbeatResult[]> {
    if (items.length === 0) return [];
    const rows = await this.run<{
      id: string;
      lease_until: Date | null;
      cancel: boolean | null;
      cancel_reason: string | null;
    }>(null, 'heartbeat', [
      JSON.stringify(
        items.map((item) => ({
          id: item.id,
          token: item.claimToken,
          lease_ms: item.leaseMs,
          max_ms: item.maxDurationMs,
          progress: item.progress ?? null,
        })),
      ),
    ]);
    return rows.map((row) => ({
      id: row.id,
      outcome: row.lease_until ? 'ok' : 'lost',
      leaseUntil: row.lease_until ?? null,
      ...(row.lease_until && row.cancel ? { cancel: { reason: row.cancel_reason } } : {}),
    }));
  }

  async complete(items: readonly CompleteItem[]): Promise<CompleteResult[]> {
    if (items.length === 0) return [];
    const rows = await this.run<{ id: string; outcome: OwnershipOutcome } & Emptied>(null, 'complete', [
      completionDocument(items),
    ]);
    this.settle(rows[0]?.emptied_groups);
    return rows.map((row) => ({ id: row.id, outcome: row.outcome }));
  }

  /**
   * A transactional handler's transaction: a connection of the store's pool (PGlite: its one
   * session, so every other statement waits until it ends) in BEGIN, handed to the handler as the
   * client the producer accepts. The completion runs on it; groups it emptied settle after commit.
   */
  async beginHandlerTransaction(): Promise<HandlerTransaction> {
    const open = await openTransaction<PgQueryable>((work) => this.driver.transaction(work));
    let emptied: GroupRef[] | null | undefined;
    let ended = false;
    return {
      // A PGlite transaction refuses statements once it ended by itself; a pg client goes back to
      // the pool, so the handler's view of it refuses them instead.
      handle: this.driver.kind === 'pg' ? endingClient(open.client, () => ended) : open.client,
      complete: async (item) => {
        // Prepared on the connection, as the store's own statements are (planned afresh it costs ~1.5 ms).
        const rows = await this.runInOwn<{ id: string; outcome: OwnershipOutcome } & Emptied>(open.client, 'complete', [
          completionDocument([item]),
        ]);
        emptied = rows[0]?.emptied_groups;
        return { id: item.id, outcome: rows[0]?.outcome ?? 'lost' };
      },
      commit: async () => {
        ended = true;
        try {
          await open.commit();
        } finally {
          // Also when the commit's reply was lost: settling re-reads each group, so a group the
          // completion did not empty after all (the commit did not happen) is left as it is.
          this.settle(emptied);
        }
      },
      rollback: () => {
        ended = true;
        return open.rollback();
      },
      readBack: (id) => this.readJob('getJobAfterWriters', id),
    };
  }

  async fail(items: readonly FailItem[]): Promise<FailResult[]> {
    if (items.length === 0) return [];
    const rows = await this.run<{ id: string; outcome: OwnershipOutcome; state: FailResult['state'] } & Emptied>(
      null,
      'fail',
      [
        JSON.stringify(
          items.map((item) => ({
            id: item.id,
            token: item.claimToken,
            error: item.error,
            stack: item.stack,
            delay_ms: item.retryDelayMs,
            dead: item.dead,
            worker: item.workerId,
            canceled: item.canceled === true,
          })),
        ),
      ],
    );
    this.settle(rows[0]?.emptied_groups);
    return rows.map((row) => ({ id: row.id, outcome: row.outcome, state: row.state ?? null }));
  }

  async release(items: readonly ReleaseItem[]): Promise<CompleteResult[]> {
    if (items.length === 0) return [];
    const rows = await this.run<{ id: string; outcome: OwnershipOutcome } & Emptied>(null, 'release', [
      JSON.stringify(items.map((item) => ({ id: item.id, token: item.claimToken, delay_ms: item.delayMs ?? 0 }))),
    ]);
    this.settle(rows[0]?.emptied_groups);
    return rows.map((row) => ({ id: row.id, outcome: row.outcome }));
  }

  async reap(batchSize: number): Promise<ReapedJob[]> {
    const rows = await this.run<
      { id: string; queue: string; state: ReapedJob['state']; attempts: number } & Emptied & {
          voided_holds: (GroupRef & { token: string })[] | null;
        }
    >(null, 'reap', [batchSize]);
    this.settle(rows[0]?.emptied_groups);
    const voided = rows[0]?.voided_holds;
    if (voided && voided.length > 0) {
      const released = await this.driver.query<GroupRef & { emptied: boolean }>(this.sql.releaseVoidHolds, [
        ...groupArrays(voided),
        voided.map((hold) => hold.token),
      ]);
      this.settle(released.rows.filter((row) => row.emptied));
    }
    return rows.map((row) => ({ id: row.id, queue: row.queue, state: row.state, attempt: Number(row.attempts) }));
  }

  async pauseQueue(queue: string, reason: string | null): Promise<boolean> {
    const rows = await this.run<{ queue: string }>(null, 'pauseQueue', [queue, reason]);
    return rows.length > 0;
  }

  async resumeQueue(queue: string): Promise<boolean> {
    const rows = await this.run<{ queue: string }>(null, 'resumeQueue', [queue]);
    return rows.length > 0;
  }

  async listPausedQueues(): Promise<QueuePause[]> {
    const rows = await this.run<{ queue: string; reason: string | null; paused_at: Date }>(
      null,
      'listPausedQueues',
      [],
    );
    return rows.map((row) => ({ queue: row.queue, reason: row.reason, pausedAt: row.paused_at }));
  }

  async cancel(ids: readonly JobId[], reason: string | null): Promise<CancelResult[]> {
    const distinct = [...new Set(ids.map((id) => assertJobId(id)))];
    if (distinct.length === 0) return [];
    const rows = await this.driver.transaction(async (client) => {
      await client.query(this.sql.cancelLockGroups, [distinct]);
      const result = await client.query<
        { id: string; queue: string | null; outcome: CancelOutcome; state: JobState | null } & Emptied
      >(this.sql.cancel, [distinct, reason]);
      return result.rows;
    });
    this.settle(rows[0]?.emptied_groups);
    return rows.map((row) => ({
      id: row.id,
      queue: row.queue ?? null,
      outcome: row.outcome,
      state: row.state ?? null,
    }));
  }

  async findJobByKey(queue: string, idempotencyKey: string): Promise<JobId | null> {
    const rows = await this.run<{ id: string }>(null, 'findJobByKey', [queue, idempotencyKey]);
    return rows[0]?.id ?? null;
  }

  async hasClaimableWork(queue: string): Promise<boolean> {
    const rows = await this.run<{ has_work: boolean }>(null, 'hasClaimableWork', [queue]);
    return rows[0]?.has_work === true;
  }

  async stats(queue: string): Promise<QueueStats> {
    const rows = await this.run<Record<string, number | null>>(null, 'stats', [queue]);
    return toQueueStats(queue, rows[0]!, COLUMNS);
  }

  async queueHealth(request: QueueHealthRequest): Promise<QueueHealth[]> {
    // Not prepared: a scrape every few seconds gains nothing from a cached plan, and a generic
    // plan cannot see the failure window, so it overestimates the attempts range (default
    // selectivity) and crossed jit_above_cost: ~50 ms of JIT compilation for a 3 ms query.
    // A short transaction scopes the monitoring settings to this read (SET LOCAL semantics).
    const rows = await this.driver.transaction(async (client) => {
      await client.query(this.sql.monitoringSettings);
      const result = await client.query<Record<string, string | number | null>>(this.sql.queueHealth, [
        request.failureWindowMs,
        request.repeatedFailures,
      ]);
      return result.rows;
    });
    return rows.map((row) => toQueueHealth(row, COLUMNS));
  }

  async scaleInputs(queue: string): Promise<ScaleInputs> {
    const [row] = await this.run<Row>(null, 'scaleInputs', [queue]);
    return toScaleInputs(row!, COLUMNS);
  }

  getJob(id: JobId): Promise<JobRecord | null> {
    return this.readJob('getJob', id);
  }

  private async readJob(statement: 'getJob' | 'getJobAfterWriters', id: JobId): Promise<JobRecord | null> {
    const rows = await this.driver.query<Row>(this.sql[statement], [id]);
    return rows.rows[0] ? toJobRecord(rows.rows[0]) : null;
  }

  async getAttempts(id: JobId): Promise<AttemptRecord[]> {
    const rows = await this.driver.query<Row>(this.sql.getAttempts, [id]);
    return rows.rows.map((row) => ({
      attempt: Number(row.attempt),
      outcome: row.outcome as AttemptRecord['outcome'],
      error: (row.error as string | null) ?? null,
      stack: (row.stack as string | null) ?? null,
      workerId: (row.worker_id as string | null) ?? null,
      startedAt: (row.started_at as Date | null) ?? null,
      finishedAt: row.finished_at as Date,
    }));
  }

  async listDead(queue: string, page: { limit: number; afterId?: JobId | null }): Promise<DeadJobPage> {
    const rows = await this.driver.query<Row>(this.sql.listDead, [queue, page.afterId ?? null, page.limit]);
    const jobs = rows.rows.map(toJobRecord);
    return { jobs, nextAfterId: jobs.length === page.limit ? jobs[jobs.length - 1]!.id : null };
  }

  async retryDead(queue: string, ids: readonly JobId[] | 'all'): Promise<JobId[]> {
    // A retried job of an ordered group takes its place in the group in the same transaction.
    const rows = await this.driver.transaction(async (client) => {
      const retried =
        ids === 'all'
          ? await client.query<{ id: string; group_key: string | null }>(this.sql.retryAllDead, [queue])
          : await client.query<{ id: string; group_key: string | null }>(this.sql.retryDead, [
              queue,
              JSON.stringify(ids),
            ]);
      const grouped = retried.rows.flatMap((row) =>
        row.group_key === null ? [] : [{ queue, key: row.group_key, id: row.id }],
      );
      const retriedByGroup = new Map<string, string[]>();
      for (const job of grouped) {
        const ids = retriedByGroup.get(groupId(job));
        if (ids) ids.push(job.id);
        else retriedByGroup.set(groupId(job), [job.id]);
      }
      await this.touchGroups(
        client,
        lowestPerGroup(grouped).map((head) => ({ ...head, retried: retriedByGroup.get(groupId(head)) })),
      );
      return retried.rows;
    });
    return rows.map((row) => row.id);
  }

  async purgeDead(queue: string, options?: { olderThanMs?: number; ids?: readonly JobId[] }): Promise<number> {
    const ids = options?.ids ? options.ids.map((id) => assertJobId(id)) : null;
    if (ids?.length === 0) return 0;
    let total = 0;
    for (;;) {
      const rows = await this.driver.query<{ deleted: number } & Emptied>(this.sql.purgeDead, [
        queue,
        options?.olderThanMs ?? 0,
        PURGE_BATCH,
        ids,
      ]);
      const deleted = Number(rows.rows[0]?.deleted ?? 0);
      this.settle(rows.rows[0]?.emptied_groups);
      total += deleted;
      if (deleted < PURGE_BATCH) return total;
    }
  }

  async listJobs(request: JobListRequest): Promise<JobListPage> {
    const { queue, state, limit, after } = checkJobListRequest(request);
    const { name, position } = listStatement(state, after);
    // One row more than the page: it says whether a next page exists.
    const result = await this.driver.query<Row>(this.sql[name], [queue, limit + 1, JOB_PREVIEW_CHARS, ...position]);
    // The last entry a grouped look-up read comes in whatever state it is in (one snapshot).
    const listed = (row: Row) => row.state === state;
    const { page, last } = splitJobListRows(
      result.rows.filter((row) => row.id !== null),
      limit,
      (row) => row.scan_end === true,
      listed,
    );
    const jobs = page.filter(listed).map(toJobSummary);
    const nextCursor = last ? encodeJobListCursor({ queue, state }, positionOf(state, last)) : null;
    // The look-up ended at its bound and nothing is left after this page: older done jobs of
    // the queue may exist that no page lists.
    const scanned = state === 'done' ? Number(result.rows[0]?.scanned ?? 0) : 0;
    return { jobs, nextCursor, scanLimited: scanned >= DONE_SCAN_LIMIT && nextCursor === null };
  }

  async recordThroughput(counts: readonly ThroughputCount[]): Promise<void> {
    const rows = sumThroughputByQueue(counts);
    if (rows.length === 0) return;
    await this.run(null, 'recordThroughput', [
      rows.map((row) => row.queue),
      rows.map((row) => row.completed),
      rows.map((row) => row.failed),
      rows.map((row) => row.dead),
      rows.map((row) => row.busyMs ?? 0),
    ]);
  }

  async readThroughput(minutes: number): Promise<ThroughputReading> {
    assertThroughputMinutes(minutes);
    const rows = await this.driver.query<{
      now: Date;
      minute: Date | null;
      queue: string;
      completed: number;
      failed: number;
      dead: number;
    }>(this.sql.readThroughput, [minutes]);
    return {
      now: rows.rows[0]!.now,
      buckets: rows.rows.flatMap((row) =>
        row.minute === null
          ? []
          : [{ minute: row.minute, queue: row.queue, completed: row.completed, failed: row.failed, dead: row.dead }],
      ),
    };
  }

  async listBlockedGroups(queue: string, page: { limit: number; afterKey?: string | null }): Promise<BlockedGroupPage> {
    const rows = await this.driver.query<{
      group_key: string;
      job_id: string;
      last_error: string | null;
      finished_at: Date | null;
    }>(this.sql.listBlockedGroups, [queue, page.afterKey ?? null, page.limit]);
    const groups = rows.rows.map((row) => ({
      groupKey: row.group_key,
      jobId: row.job_id,
      error: row.last_error ?? null,
      diedAt: row.finished_at ?? null,
    }));
    return { groups, nextAfterKey: groups.length === page.limit ? groups[groups.length - 1]!.groupKey : null };
  }

  async repairGroups(limit: number): Promise<GroupRepair[]> {
    const found = await this.driver.query<{ kind: string; queue: string | null; key: string | null }>(
      this.sql.repairCheck,
      [
        this.rowSweep?.queue ?? null,
        this.rowSweep?.key ?? null,
        this.orphanSweep?.queue ?? null,
        this.orphanSweep?.key ?? null,
        limit,
      ],
    );
    const suspects: GroupRef[] = [];
    const orphans: GroupRef[] = [];
    let rowsEnd: SweepCursor = null;
    let walkEnd: SweepCursor = null;
    for (const row of found.rows) {
      const group = { queue: row.queue!, key: row.key! };
      if (row.kind === 'row') suspects.push(group);
      else if (row.kind === 'orphan') orphans.push(group);
      else if (row.kind === 'rows-end') rowsEnd = group;
      else if (row.kind === 'walk-end') walkEnd = group;
    }
    this.rowSweep = rowsEnd;
    this.orphanSweep = walkEnd;
    const repairs: GroupRepair[] = [];
    if (suspects.length > 0) {
      // Checked again under a lock, in a new statement: a transition may have been between its
      // statements when the look was taken.
      await this.driver.transaction(async (client) => {
        await client.query(`SET LOCAL lock_timeout = ${REPAIR_LOCK_TIMEOUT_MS}`);
        const locked = await client.query<GroupRef>(this.sql.repairLock, groupArrays(suspects));
        if (locked.rows.length === 0) return;
        const fixed = await client.query<{ queue: string; key: string; problem: string }>(
          this.sql.repairApply,
          groupArrays(locked.rows),
        );
        for (const row of fixed.rows) repairs.push({ queue: row.queue, groupKey: row.key, problem: row.problem });
      });
    }
    if (orphans.length > 0) {
      await this.driver.transaction(async (client) => {
        // ON CONFLICT waits for a producer creating the same row; bounded, and retried next pass.
        await client.query(`SET LOCAL lock_timeout = ${REPAIR_LOCK_TIMEOUT_MS}`);
        const created = await client.query<{ queue: string; key: string; head_id: string }>(
          this.sql.repairOrphans,
          groupArrays(orphans),
        );
        for (const row of created.rows) {
          repairs.push({
            queue: row.queue,
            groupKey: row.key,
            problem: `unfinished jobs but no group row; created it with head ${row.head_id}`,
          });
        }
      });
    }
    return repairs;
  }

  /**
   * Adds jobs to their groups (see touchLock and touchMove in postgres.queries.ts), in the
   * transaction that inserted them. A round that finds a group created or deleted by another
   * session since its snapshot leaves it to the next round, which sees it.
   */
  private async touchGroups(client: PgQueryable, heads: readonly GroupHead[]): Promise<void> {
    for (const [queue, keys] of keysByQueue(heads)) {
      const byKey = new Map(heads.filter((head) => head.queue === queue).map((head) => [head.key, head]));
      let pending = keys.map((key) => byKey.get(key)!);
      const locked: GroupHead[] = [];
      for (let round = 0; pending.length > 0; round++) {
        if (round === GROUP_TOUCH_ROUNDS) {
          throw new Error(`ordered groups did not settle: ${pending.length} group(s) kept being created or deleted`);
        }
        const rows = await client.query<{ key: string; status: 'locked' | 'created' | 'missing' }>(this.sql.touchLock, [
          queue,
          pending.map((head) => head.key),
          pending.map((head) => head.id),
        ]);
        const of = (status: string) =>
          rows.rows.filter((row) => row.status === status).map((row) => byKey.get(row.key)!);
        locked.push(...of('locked'));
        pending = of('missing');
      }
      if (locked.length === 0) continue;
      const retried = locked.flatMap((head) => (head.retried ?? []).map((id) => ({ key: head.key, id })));
      await client.query(this.sql.touchMove, [
        queue,
        locked.map((head) => head.key),
        locked.map((head) => head.id),
        retried.map((job) => job.key),
        retried.map((job) => job.id),
      ]);
    }
  }

  /**
   * Settles groups a transition emptied (released with no unfinished job in its snapshot). Once
   * no producer that saw the group held is still open, a new statement sees every job they
   * added: the lowest becomes the head, else the row goes. The lock is only a barrier: a producer
   * that comes after it sees the group idle and sets the head itself. Groups a producer still
   * holds are settled in the background, waiting for its transaction, so a caller's long
   * transaction never holds up the worker that completed a job.
   */
  private settle(emptied: GroupRef[] | null | undefined): void {
    if (!emptied || emptied.length === 0 || this.closed) return;
    for (const group of emptied) this.toSettle.set(groupId(group), group);
    this.settlingNow ??= this.settleLoop().finally(() => {
      this.settlingNow = null;
    });
  }

  /** Settles emptied groups in batches, off the path of the call that emptied them. */
  private async settleLoop(): Promise<void> {
    while (this.toSettle.size > 0 && !this.closed) {
      const batch = [...this.toSettle.values()].slice(0, SETTLE_BATCH);
      for (const group of batch) this.toSettle.delete(groupId(group));
      for (const [queue, keys] of keysByQueue(batch)) {
        let held: string[] = keys;
        try {
          // One transaction: settleLock's row locks must last through settleApply. In autocommit
          // they ended with the first statement, and a producer that inserted a job, then touched
          // the group (FOR KEY SHARE) between the two and committed while settleApply's DELETE
          // waited for that lock, lost its group: the DELETE re-checks the group row, not its
          // subquery's older snapshot of jobs. Held, the locks make such a producer's touch wait,
          // find the row gone, and create it again.
          const rows = await this.driver.transaction(async (client) => {
            const lock = await client.query<{ key: string; locked: boolean }>(this.sql.settleLock, [queue, keys]);
            const locked = lock.rows.filter((row) => row.locked).map((row) => row.key);
            if (locked.length > 0) await client.query(this.sql.settleApply, [queue, locked]);
            return lock.rows;
          });
          held = rows.filter((row) => !row.locked).map((row) => row.key);
        } catch {
          // All of them are tried again later.
        }
        const retry = new Set(held);
        for (const key of keys) {
          if (retry.has(key)) this.settleLater({ queue, key });
          else this.settleRetries.delete(groupId({ queue, key }));
        }
      }
    }
  }

  /**
   * A group a producer still holds (its FOR KEY SHARE) is tried again later, never waited for
   * on a pool connection: a caller's long transaction must not hold the store's connections.
   * Backs off from 100 ms to 2 s, for up to 10 minutes; the repair sweep settles what is left.
   */
  private settleLater(group: GroupRef): void {
    const id = groupId(group);
    if (this.closed) return;
    const entry = this.settleRetries.get(id) ?? { group, delayMs: SETTLE_RETRY_MIN_MS, since: Date.now() };
    if (Date.now() - entry.since > SETTLE_RETRY_FOR_MS) {
      this.settleRetries.delete(id);
      return;
    }
    entry.delayMs = Math.min(entry.delayMs * 2, SETTLE_RETRY_MAX_MS);
    this.settleRetries.set(id, entry);
    if (this.settleTimer) return;
    this.settleTimer = setTimeout(
      () => {
        this.settleTimer = null;
        const due = [...this.settleRetries.values()];
        // All pending groups are tried again, after the shortest of their backoffs.
        this.settle(due.map((retry) => retry.group));
      },
      Math.min(...[...this.settleRetries.values()].map((retry) => retry.delayMs)),
    );
    this.settleTimer.unref?.();
  }

  async cleanup(request: CleanupRequest): Promise<number> {
    const jobs = await this.countDeleted(this.sql.cleanup, [
      request.doneRetentionMs,
      request.idempotencyRetentionMs,
      request.deadRetentionMs,
      request.batchSize,
    ]);
    await this.driver.query(this.sql.cleanupThroughput, [THROUGHPUT_RETENTION_MS, request.batchSize]);
    await this.driver.query(this.sql.cleanupFlowState, [request.batchSize]);
    return jobs;
  }

  private async countDeleted(text: string, params: unknown[]): Promise<number> {
    const result = (await this.driver.query(text, params)) as { rowCount?: number | null; affectedRows?: number };
    return Number(result.rowCount ?? result.affectedRows ?? 0);
  }

  async scheduleDueIn(): Promise<{ now: Date; dueInMs: number | null }> {
    const rows = await this.run<{ now: Date; due_in_ms: number | null }>(null, 'scheduleDueIn', []);
    const row = rows[0]!;
    return { now: row.now, dueInMs: row.due_in_ms === null ? null : Number(row.due_in_ms) };
  }

  async fireDueSchedules(
    limit: number,
    plan: (rows: readonly ScheduleRow[], now: Date) => ScheduleFiring[],
  ): Promise<ScheduleFiring[]> {
    return this.driver.transaction(async (client) => {
      const locked = await this.run<Row & { db_now: Date }>(client, 'scheduleLockDue', [limit]);
      if (locked.length === 0) return [];
      const rows = locked.map((row) => toScheduleRow(row, COLUMNS));
      const firings = plan(rows, locked[0]!.db_now);
      const lockedIds = new Set(rows.map((row) => row.id));
      const stray = firings.find((firing) => !lockedIds.has(firing.id));
      // Firing a schedule this transaction does not hold could fire a tick twice.
      if (stray) throw new Error(`the firing plan named schedule '${stray.id}', which this round did not lock`);
      // One enqueue per queue (the bulk statement takes one queue); a tick's key already in the
      // queue returns the existing job, so a repeated tick never fails the round.
      const jobs = byQueue(
        firings.flatMap((firing) => firing.jobs),
        (job) => job,
      );
      for (const queueJobs of jobs.values()) await this.enqueueOn(queueJobs, client);
      if (firings.length > 0) {
        await this.run(client, 'scheduleAdvance', [
          JSON.stringify(
            firings.map((firing) => ({
              id: firing.id,
              next_run_at: firing.nextRunAt?.toISOString() ?? null,
              last_tick: firing.lastTick?.toISOString() ?? null,
              fired: firing.jobs.length > 0,
            })),
          ),
        ]);
      }
      return firings;
    });
  }

  async upsertSchedules(items: readonly ScheduleUpsert[], pruneSource?: ScheduleSource): Promise<void> {
    // One entry per id (the last wins): a statement cannot update a row twice.
    const byId = new Map(items.map((item) => [item.id, item]));
    const rows = [...byId.values()]
      .sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0))
      .map((item) => ({
        id: item.id,
        queue: item.queue,
        cron: item.cron,
        timezone: item.timezone,
        payload: item.payload,
        options: item.options,
        catch_up: item.catchUp,
        source: item.source,
        next_run_at: item.nextRunAt?.toISOString() ?? null,
      }));
    if (pruneSource === undefined) {
      if (rows.length > 0) await this.driver.query(this.sql.scheduleUpsert, [JSON.stringify(rows)]);
      return;
    }
    await this.driver.transaction(async (client) => {
      if (rows.length > 0) await client.query(this.sql.scheduleUpsert, [JSON.stringify(rows)]);
      await client.query(this.sql.schedulePrune, [pruneSource, rows.map((row) => row.id)]);
    });
  }

  async getSchedule(id: string): Promise<ScheduleRow | null> {
    const rows = await this.driver.query<Row>(this.sql.scheduleGet, [id]);
    return rows.rows[0] ? toScheduleRow(rows.rows[0], COLUMNS) : null;
  }

  async listSchedules(): Promise<ScheduleRow[]> {
    const rows = await this.driver.query<Row>(this.sql.scheduleList);
    return rows.rows.map((row) => toScheduleRow(row, COLUMNS));
  }

  async deleteSchedule(id: string): Promise<boolean> {
    const rows = await this.driver.query(this.sql.scheduleDelete, [id]);
    return rows.rows.length > 0;
  }

  async setSchedulePaused(id: string, paused: boolean, nextRunAt: Date | null): Promise<boolean> {
    const rows = await this.driver.query(this.sql.schedulePause, [id, paused, nextRunAt?.toISOString() ?? null]);
    return rows.rows.length > 0;
  }

  async ping(timeoutMs: number): Promise<void> {
    await withTimeout(this.driver.query('SELECT 1'), timeoutMs, 'database ping');
  }

  async notify(queue: string): Promise<void> {
    await this.driver.queryPrepared(this.prepared('notify'), this.sql.notify, [this.channel, queue]);
  }

  listen(onWake: (queue: string) => void): Promise<() => Promise<void>> {
    return this.driver.listen(this.channel, onWake);
  }

  isTransientError(error: unknown): boolean {
    return isTransientPgError(error);
  }

  isRefusal(error: unknown): boolean {
    return isPgRefusal(error);
  }

  async close(): Promise<void> {
    // What is being settled finishes first (bounded); groups left unsettled are headless rows
    // with no job, which a producer heads again or the repair sweep deletes.
    if (this.settlingNow) await settleWithin(this.settlingNow, 5_000);
    this.closed = true;
    if (this.settleTimer) clearTimeout(this.settleTimer);
    await this.driver.close();
  }

  /**
   * A hot statement on a transaction of the store's own (the flow claim): prepared on that
   * connection too where the driver supports it, since planning its statements costs more than
   * running them.
   */
  private async runInOwn<R>(client: PgQueryable, name: keyof PgQueries, params: unknown[]): Promise<R[]> {
    if (this.driver.kind !== 'pg') return (await client.query<R>(this.sql[name], params)).rows;
    const named = client as unknown as NamedQueryable;
    return (await named.query<R>({ name: this.prepared(name), text: this.sql[name], values: params })).rows;
  }

  /** Hot statements run prepared on the store's pool; on a caller's client they run plain. */
  private async run<R>(client: PgQueryable | null, name: keyof PgQueries, params: unknown[]): Promise<R[]> {
    const result = client
      ? await client.query<R>(this.sql[name], params)
      : await this.driver.queryPrepared<R>(this.prepared(name), this.sql[name], params);
    return result.rows;
  }
}

/**
 * Payload characters above which a uniform batch goes through the general statement, keeping
 * the one text parameter well under PostgreSQL's 1 GB limit (a character is at most 3 UTF-8 bytes).
 */
const UNIFORM_DOCUMENT_MAX_CHARS = 64 * 1024 * 1024;

/**
 * Parameters of the uniform bulk statement when it applies: one queue, no idempotency keys,
 * and the same priority, run-at, delay, group, max attempts and trace context for every job
 * (an enqueueMany's jobs share its span's); else null.
 * The payloads travel as one JSON array: joining the already serialized payloads costs
 * nothing, where a jsonb[] parameter is escaped element by element on both sides.
 */
function uniformParams(jobs: readonly NewJob[]): unknown[] | null {
  const first = jobs[0]!;
  const runAt = first.runAt?.getTime() ?? null;
  const traceContext = first.traceContext ?? null;
  let chars = 0;
  for (const job of jobs) {
    chars += job.payload.length;
    if (
      chars > UNIFORM_DOCUMENT_MAX_CHARS ||
      job.idempotencyKey !== null ||
      job.queue !== first.queue ||
      job.priority !== first.priority ||
      (job.runAt?.getTime() ?? null) !== runAt ||
      job.delayMs !== first.delayMs ||
      job.groupKey !== first.groupKey ||
      job.concurrencyKey !== first.concurrencyKey ||
      job.maxAttempts !== first.maxAttempts ||
      job.defaultMaxAttempts !== first.defaultMaxAttempts ||
      (job.traceContext ?? null) !== traceContext
    ) {
      return null;
    }
  }
  return [
    first.queue,
    `[${jobs.map((job) => job.payload).join(',')}]`,
    first.priority,
    first.runAt?.toISOString() ?? null,
    first.delayMs,
    first.groupKey,
    first.maxAttempts,
    first.defaultMaxAttempts,
    traceContext,
    first.concurrencyKey,
  ];
}

/**
 * One array per column. Jobs of one call may still differ in queue (the store accepts mixed
 * batches), so the queue is checked to be uniform and passed once.
 */
function enqueueManyParams(jobs: readonly NewJob[]): unknown[] {
  const queue = jobs[0]!.queue;
  if (jobs.some((job) => job.queue !== queue)) {
    throw new SqlQueueValidationError('a bulk enqueue takes jobs of one queue');
  }
  return [
    queue,
    jobs.map((job) => job.payload),
    jobs.map((job) => job.priority),
    jobs.map((job) => job.runAt?.toISOString() ?? null),
    jobs.map((job) => job.delayMs),
    jobs.map((job) => job.groupKey),
    jobs.map((job) => job.idempotencyKey),
    jobs.map((job) => job.maxAttempts),
    jobs.map((job) => job.defaultMaxAttempts),
    jobs.map((job) => job.traceContext ?? null),
    jobs.map((job) => job.concurrencyKey),
  ];
}

/** The `emptied_groups` column of the statements that release groups. */
interface Emptied {
  emptied_groups: GroupRef[] | null;
}

/** Items per queue, each list in input order. */
function byQueue<T extends { queue: string }, V>(items: readonly T[], value: (item: T) => V): Map<string, V[]> {
  const lists = new Map<string, V[]>();
  for (const item of items) {
    const list = lists.get(item.queue);
    if (list) list.push(value(item));
    else lists.set(item.queue, [value(item)]);
  }
  return lists;
}

/** Keys per queue, for the statements that take one queue and an array of its group keys. */
function keysByQueue(groups: readonly GroupRef[]): Map<string, string[]> {
  return byQueue(groups, (group) => group.key);
}

/** Groups as the group statements take them: an array of queues and an array of keys. */
function groupArrays(groups: readonly GroupRef[]): [string[], string[]] {
  return [groups.map((group) => group.queue), groups.map((group) => group.key)];
}

function groupId(group: GroupRef): string {
  return `${group.queue}\u0000${group.key}`;
}

/**
 * A job entering its group: the lowest id an enqueue added to it, or that retryDead moved back
 * (with every id retried in the group, one of which may be the dead job that blocks it).
 */
interface GroupHead extends GroupRef {
  id: JobId;
  retried?: JobId[];
}

/** The lowest job id per group, in one entry per group. */
function lowestPerGroup(items: readonly GroupHead[]): GroupHead[] {
  const lowest = new Map<string, GroupHead>();
  for (const item of items) {
    const current = lowest.get(groupId(item));
    if (!current || BigInt(item.id) < BigInt(current.id)) lowest.set(groupId(item), item);
  }
  return [...lowest.values()];
}

/** The jobs an enqueue created in ordered groups, as the lowest new id per group. */
function groupHeads(jobs: readonly NewJob[], results: readonly EnqueueResult[]): GroupHead[] {
  return lowestPerGroup(
    jobs.flatMap((job, index) =>
      job.groupKey !== null && results[index]!.created
        ? [{ queue: job.queue, key: job.groupKey, id: results[index]!.jobId }]
        : [],
    ),
  );
}

/** Claimed rows as jobs; the plain claim's marker row (no id) is left out. */
function toClaimedJobs(queue: string, rows: readonly Row[]): ClaimedJob[] {
  return rows
    .filter((row) => row.id !== null)
    .map((row) => ({
      id: row.id as string,
      queue,
      payload: row.payload,
      priority: Number(row.priority),
      groupKey: (row.group_key as string | null) ?? null,
      idempotencyKey: (row.idempotency_key as string | null) ?? null,
      attempt: Number(row.attempts),
      maxAttempts: Number(row.max_attempts),
      claimToken: row.claim_token as string,
      enqueuedAt: new Date(row.created_ms as number),
      claimedAt: new Date(row.claimed_ms as number),
      leaseUntil: new Date(row.lease_until_ms as number),
      traceContext: (row.trace_context as string | null) ?? null,
    }));
}

/** A node-postgres client: takes a query config, so a statement can be named (prepared). */
interface NamedQueryable {
  query<R>(config: { name: string; text: string; values: unknown[] }): Promise<{ rows: R[] }>;
}

/** flowBudget's row: the recorded limits (null: none), the counts they apply to, the work waiting. */
interface FlowBudgetRow {
  at: Date;
  global_concurrency: number | null;
  concurrency_per_key: number | null;
  rate_max: number | null;
  rate_per_ms: number | null;
  key_rate_max: number | null;
  key_rate_per_ms: number | null;
  running: number | null;
  recent_starts: number | null;
  rate_free_in_ms: number | null;
  paused: boolean;
  keyed_work: boolean;
  plain_work: boolean;
}

/** The complete statement's $1: the items as a JSON document. */
function completionDocument(items: readonly CompleteItem[]): string {
  return JSON.stringify(
    items.map((item) => ({
      id: item.id,
      token: item.claimToken,
      result: item.result ?? null,
      progress: item.progress ?? null,
    })),
  );
}

function toJobRecord(row: Row): JobRecord {
  return {
    ...jobFields(row, COLUMNS),
    payload: row.payload,
    claimToken: (row.claim_token as string | null) ?? null,
    lastError: (row.last_error as string | null) ?? null,
    cancelRequestedAt: (row.cancel_requested_at as Date | null) ?? null,
    concurrencyKey: (row.concurrency_key as string | null) ?? null,
    cancelReason: (row.cancel_reason as string | null) ?? null,
    result: row.result ?? null,
    progress: row.progress ?? null,
  };
}

/** A position no job sorts before, or after: the bounds of a listing's keyset conditions. */
const FIRST_PRIORITY = 2_147_483_648;
const PAST_PRIORITY = -2_147_483_649;
const EARLIEST = '-infinity';
const LATEST = 'infinity';
const BIGINT_MAX = '9223372036854775807';

/**
 * A listing statement and the position parameters it takes after $1..$3 (see the statements in
 * postgres.queries.ts): the position after `after`, or before every job for a first page. A
 * position in the grouped part puts the ungrouped one past its end.
 */
function listStatement(
  state: ListedJobState,
  after: JobListPosition | null,
): { name: (typeof JOB_LIST_STATEMENTS)[ListedJobState]; position: unknown[] } {
  const name = JOB_LIST_STATEMENTS[state];
  const grouped = after?.part === 'grouped';
  const groupedAfter = grouped ? [after.groupKey, after.id] : ['', '0'];
  switch (state) {
    case 'ready':
      if (grouped) return { name, position: [PAST_PRIORITY, LATEST, BIGINT_MAX, ...groupedAfter] };
      return {
        name,
        position: [after?.priority ?? FIRST_PRIORITY, after?.time ?? EARLIEST, after?.id ?? '0', ...groupedAfter],
      };
    case 'delayed':
      if (grouped) return { name, position: [LATEST, BIGINT_MAX, ...groupedAfter] };
      return { name, position: [after?.time ?? EARLIEST, after?.id ?? '0', ...groupedAfter] };
    case 'leased':
      return { name, position: [after?.time ?? EARLIEST, after?.id ?? '0'] };
    case 'done':
      return { name, position: [after?.time ?? LATEST, after?.id ?? BIGINT_MAX, DONE_SCAN_LIMIT] };
    case 'dead':
      return { name, position: [after ? (BigInt(after.id) - 1n).toString() : BIGINT_MAX] };
  }
}

/** Where a listing stops after `row`: its sort key in its state's order. */
function positionOf(state: ListedJobState, row: Row): JobListPosition {
  const groupKey = (row.group_key as string | null) ?? null;
  const grouped = (state === 'ready' || state === 'delayed') && groupKey !== null;
  return {
    part: grouped ? 'grouped' : 'ungrouped',
    id: row.id as string,
    priority: state === 'ready' && !grouped ? Number(row.priority) : null,
    time: state === 'dead' || grouped ? null : (row.cursor_time as string),
    groupKey: grouped ? groupKey : null,
  };
}

function toJobSummary(row: Row): JobSummary {
  return {
    ...jobFields(row, COLUMNS),
    payloadPreview: row.payload_preview as string,
    lastErrorPreview: (row.last_error_preview as string | null) ?? null,
  };
}
