import type {
  BlockedGroupPage,
  CancelResult,
  CleanupRequest,
  ClaimedJob,
  CompleteItem,
  ClaimRequest,
  CompleteResult,
  DeadJobPage,
  EnqueueResult,
  FailItem,
  GroupRepair,
  FailResult,
  HeartbeatItem,
  HeartbeatResult,
  AttemptRecord,
  JobId,
  JobListPage,
  JobListRequest,
  JobRecord,
  NewJob,
  ReleaseItem,
  QueueHealth,
  QueueHealthRequest,
  QueuePause,
  QueueSetting,
  FlowUsage,
  QueueStats,
  ReapedJob,
  ThroughputCount,
  ThroughputReading,
} from './types.js';
import type { ScaleInputs } from './scaling/index.js';
import type { ScheduleStore } from './schedules/index.js';

export type Dialect = 'postgres' | 'mssql';

/**
 * Keys a flow claim with room for `budget` jobs looks at: FLOW_KEYS_AHEAD beyond the budget (some
 * may be at their limit), at most FLOW_KEYS_MAX; each is one index descent for its ready jobs and
 * one for its leased ones, on either dialect.
 */
export const FLOW_KEYS_AHEAD = 16;
export const FLOW_KEYS_MAX = 1_000;

export function flowKeysToWalk(budget: number): number {
  return Math.min(budget + FLOW_KEYS_AHEAD, FLOW_KEYS_MAX);
}

export type MigrationMode = 'auto' | 'check' | 'off';

export interface SchemaStatus {
  /** Version recorded in the database; 0 when the schema is not installed. */
  current: number;
  /** Latest version this build of the library knows. */
  latest: number;
}

/**
 * A transactional handler's transaction (queue option `transactional`), on a connection of the
 * store's own, held from before the handler runs until it commits or rolls back.
 */
export interface HandlerTransaction {
  /**
   * What the handler gets as `context.transaction`: the object `producer.enqueue` accepts as
   * `transaction` (a pg client in a transaction, a PGlite transaction, an mssql Transaction).
   */
  readonly handle: unknown;
  /** The job's completion inside the transaction, token-checked: on 'lost' the caller rolls back. */
  complete(item: CompleteItem): Promise<CompleteResult>;
  /** Commits; rejects when the commit failed or its reply was lost (whether it committed is then unknown). */
  commit(): Promise<void>;
  /**
   * Rolls back; never rejects (a broken connection has rolled back on the server by itself). Also
   * while the handler still has a statement running (an abandoned handler): the handle refuses
   * new statements at once, and the connection is never handed back to the pool with the
   * transaction open (closed instead where the driver cannot roll back mid-request).
   */
  rollback(): Promise<void>;
  /**
   * After a commit that failed: the job's row as the database has it once that commit has ended,
   * read on another connection with a locking read (it waits for a commit still in progress
   * instead of reading the row from before it), so the outcome is found out, not guessed.
   */
  readBack(id: JobId): Promise<JobRecord | null>;
}

/**
 * The port between the engine and a database. Each dialect implements it in `store/<dialect>/`
 * and one contract suite (test/integration) proves them equivalent.
 *
 * Every write that concerns a claimed job is conditional on job id + claim token + state,
 * and reports `lost` instead of pretending success. Batch methods take many items and run
 * one statement, so throughput is not capped by one round trip per job. Recurring jobs'
 * schedules are part of the port (ScheduleStore).
 */
export interface QueueStore extends ScheduleStore {
  readonly dialect: Dialect;
  readonly schema: string;
  /**
   * Connections of the pool the store runs its statements on (its own or the application's);
   * null when it cannot tell or there is no pool (PGlite: one session).
   */
  readonly poolSize?: number | null;
  /**
   * Every statement shares one session (PGlite): a handler's transaction held open makes every
   * other statement wait, heartbeats included, and nothing else can take its job meanwhile.
   */
  readonly singleSession?: boolean;

  /** Applies (`auto`) or verifies (`check`) the schema; refuses a schema newer than the code. */
  migrate(mode: MigrationMode): Promise<SchemaStatus>;

  /**
   * Inserts jobs in one round trip, in input order. With `transaction` (a driver transaction
   * or client of the dialect), the jobs commit or roll back with the caller's work. A job's
   * maxAttempts is its own, else its queue's recorded setting, else its `defaultMaxAttempts`,
   * resolved inside the insert statement (no extra round trip).
   */
  enqueue(jobs: readonly NewJob[], transaction?: unknown): Promise<EnqueueResult[]>;

  /**
   * Records (insert or update) the maxAttempts a queue's consumers apply, read by every later
   * enqueue of the queue that does not give its own. Safe to run from many processes at once.
   */
  recordQueueSettings(settings: readonly QueueSetting[]): Promise<void>;

  /** Atomically leases up to `limit` due jobs of a queue, each with a fresh claim token. */
  claim(request: ClaimRequest): Promise<ClaimedJob[]>;

  /** Extends leases, keeping tokens. */
  heartbeat(items: readonly HeartbeatItem[]): Promise<HeartbeatResult[]>;

  /** Records completions, each with its handler's result (stored in the same statement). */
  complete(items: readonly CompleteItem[]): Promise<CompleteResult[]>;

  /** Records failed attempts and schedules a retry, or moves jobs to dead. */
  fail(items: readonly FailItem[]): Promise<FailResult[]>;

  /**
   * Gives back leased jobs, the attempt not counted and none recorded: ones that never started
   * (prefetched, or stopped by shutdown before running) ready again at once; postponed ones
   * (`delayMs`, a rate-limited handler) delayed until then. A job cancel() marked ends canceled.
   */
  release(items: readonly ReleaseItem[]): Promise<CompleteResult[]>;

  /** Returns up to `batchSize` expired leases to ready (or dead when out of attempts). */
  reap(batchSize: number): Promise<ReapedJob[]>;

  /**
   * Ordered groups stopped by a dead job, by group key. Index-backed (blocked groups only).
   */
  listBlockedGroups(queue: string, page: { limit: number; afterKey?: string | null }): Promise<BlockedGroupPage>;

  /**
   * The repair sweep, run by the reaper: checks the cached state of up to `limit` ordered groups
   * (resuming where the last call stopped, so every group is visited over successive calls)
   * against their jobs, fixes the ones that disagree and returns them. Normal operation never
   * needs a fix: each one is a bug or a manual edit, and is counted in a metric that should
   * stay 0. Never waits on a producer's or claimer's open transaction (such groups are skipped
   * and checked on a later pass).
   */
  repairGroups(limit: number): Promise<GroupRepair[]>;

  /**
   * Pauses a queue for every instance: from this statement's commit on, no claim of the queue
   * leases a job (the claim itself checks), until resumeQueue. True when this call paused it,
   * false when it was paused already (the first reason stays).
   */
  pauseQueue(queue: string, reason: string | null): Promise<boolean>;

  /** Ends a queue's pause; true when it was paused. */
  resumeQueue(queue: string): Promise<boolean>;

  /** Every paused queue, by name. */
  listPausedQueues(): Promise<QueuePause[]>;

  /**
   * Cancels jobs (see CancelOutcome): a ready or delayed one becomes canceled at once (an ordered
   * group it heads moves on, as after a completion); a leased one is marked, and heartbeats tell
   * its owner. A finished or missing job is reported as such and left alone. One result per
   * distinct id, in input order.
   */
  cancel(ids: readonly JobId[], reason: string | null): Promise<CancelResult[]>;

  /** The id of the job with this idempotency key in the queue, or null. */
  findJobByKey(queue: string, idempotencyKey: string): Promise<JobId | null>;

  /** Cheap probe: is there at least one due job that no one holds? Never waits on open transactions. */
  hasClaimableWork(queue: string): Promise<boolean>;

  /**
   * After an empty claim: how soon a claim of the queue may find work the store held back (its
   * rate window full, by the last claim's reading), or null when it cannot tell. Readers wait
   * no longer than this.
   */
  claimRetryHintMs?(queue: string): number | null;
  /** Opens a transactional handler's transaction (see HandlerTransaction). */
  beginHandlerTransaction?(): Promise<HandlerTransaction>;

  /**
   * The queue's flow limits and what they hold back now, with its `top` busiest keys. A store
   * without flow control (SQL Server in this release) has none.
   */
  flowUsage?(queue: string, top: number): Promise<FlowUsage>;

  stats(queue: string): Promise<QueueStats>;

  /**
   * The figures of every queue that has live jobs (ready, leased or dead) or attempts that
   * ended within the failure window, in one round trip, for metrics scrapes. Index-backed: the
   * cost follows live rows and recent attempts, never the finished history. Never waits on a
   * producer's or claimer's open transaction (rows locked at that instant are not counted).
   */
  queueHealth(request: QueueHealthRequest): Promise<QueueHealth[]>;

  /**
   * What the queue's scale recommendation is computed from (core/scaling): claimable backlog,
   * running jobs, recent completions, pause and flow limits, in one statement. The SQL function
   * migrations install for KEDA computes the recommendation from the same statement.
   */
  scaleInputs?(queue: string): Promise<ScaleInputs>;

  getJob(id: JobId): Promise<JobRecord | null>;

  /** Failed and lease-expired attempts, then the completion when the job is done. */
  getAttempts(id: JobId): Promise<AttemptRecord[]>;

  listDead(queue: string, page: { limit: number; afterId?: JobId | null }): Promise<DeadJobPage>;

  /** Dead → ready with a fresh attempt budget. Returns the ids actually moved. */
  retryDead(queue: string, ids: readonly JobId[] | 'all'): Promise<JobId[]>;

  /**
   * Deletes dead jobs of a queue (all of them, those dead longer than `olderThanMs`, or only
   * `ids`); returns how many. A blocked ordered group whose dead job is purged runs again.
   */
  purgeDead(queue: string, options?: { olderThanMs?: number; ids?: readonly JobId[] }): Promise<number>;

  /** One page of a queue's jobs in one state, index-backed (see JobListRequest for each order). */
  listJobs(request: JobListRequest): Promise<JobListPage>;

  /**
   * Adds a process's outcome counts to the current minute's bucket of each queue (database
   * clock), in one statement; safe from many processes at once. Nothing is sent for no counts.
   */
  recordThroughput(counts: readonly ThroughputCount[]): Promise<void>;

  /**
   * Per-minute outcome counts of every queue over the last `minutes` (1..1440), in one
   * statement bounded by queues × minutes rows.
   */
  readThroughput(minutes: number): Promise<ThroughputReading>;

  /**
   * Deletes one batch of old finished jobs (and their attempts), and throughput buckets older
   * than THROUGHPUT_RETENTION_MS; returns how many jobs.
   */
  cleanup(request: CleanupRequest): Promise<number>;

  /** A bounded-time round trip, for readiness checks. */
  ping(timeoutMs: number): Promise<void>;

  /**
   * Asks workers in other processes to look at a queue (PostgreSQL: NOTIFY, sent outside any
   * producer transaction). Optional: stores without a wake channel leave it undefined.
   */
  notify?(queue: string): Promise<void>;

  /** Subscribes to wake-ups from other processes; returns an unsubscribe function. */
  listen?(onWake: (queue: string) => void): Promise<() => Promise<void>>;

  /** True when an error is worth retrying after a pause (connection loss, deadlock, lock timeout). */
  isTransientError(error: unknown): boolean;

  /**
   * True when the database answered the statement with an error, so it stored nothing (the
   * store's statements are atomic): a constraint, a deadlock victim, a server-side timeout. False
   * when the outcome is unknown (connection lost, client-side timeout): the statement may have
   * committed, and sending it again could store a job twice.
   */
  isRefusal(error: unknown): boolean;

  /** Closes what the store opened itself; a pool passed in by the application stays open. */
  close(): Promise<void>;
}
