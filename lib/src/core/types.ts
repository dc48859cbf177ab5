/**
 * States a job moves through. `delayed`: waiting for its run time (a delayed enqueue or a retry
 * backing off); the first claim of its queue after that time makes it `ready` and may lease it at
 * once. `done`, `dead` and `canceled` are final (an operator may retry a dead job). `canceled`:
 * stopped by `cancel()` before it ran, or acknowledged as canceled by the worker that ran it.
 * (Spelled with one l: the state column holds 8 characters, and the filtered indexes built on it
 * keep its type fixed.)
 */
export type JobState = 'ready' | 'delayed' | 'leased' | 'done' | 'dead' | 'canceled';

/** The states a queue's jobs are listed by (a canceled job is looked up by its id). */
export type ListedJobState = Exclude<JobState, 'canceled'>;

/** Job ids are decimal strings: the column is a 64-bit integer, beyond JavaScript's safe range. */
export type JobId = string;

/** Options accepted for each enqueued job. */
export interface EnqueueOptions {
  /**
   * Business id of the job, unique per queue: enqueueing the same key again returns the
   * existing job (`created: false`) instead of a second one. Handlers see it, so they can
   * pass it to an idempotent receiver.
   */
  idempotencyKey?: string;
  /** Earliest time the job may run. Mutually exclusive with `delayMs`. */
  runAt?: Date;
  /** Delay from now (database clock) before the job may run. */
  delayMs?: number;
  /** Higher runs first; default 0. Ordering is best effort, never a FIFO promise. */
  priority?: number;
  /**
   * Ordered group: jobs of one queue with the same key run one at a time, in enqueue (id)
   * order, each after the one before it finished (done, or dead under `groupOnDead: 'continue'`);
   * different groups run in parallel. A job waiting for a retry keeps its place.
   */
  groupKey?: string;
  /**
   * Flow control key (a tenant, a customer, an API account): with the queue's
   * `concurrencyPerKey` at most that many jobs of one key run at once across all instances, with
   * `rateLimitPerKey` at most that many start per window, and claims take keys in turn, so one
   * key's backlog does not hold the others back. Not combined with `groupKey` (an ordered group
   * already runs one job at a time).
   */
  concurrencyKey?: string;
  /**
   * Attempts before the job is dead. Default: what the queue's consumers recorded at boot (their
   * handler's), else this process's options for the queue (25 if none).
   */
  maxAttempts?: number;
}

/** One job as handed to a store: already validated and serialized. */
export interface NewJob {
  queue: string;
  /** JSON text of the payload. */
  payload: string;
  priority: number;
  /** Absolute time, or null for "now + delayMs" on the database clock. */
  runAt: Date | null;
  delayMs: number;
  groupKey: string | null;
  idempotencyKey: string | null;
  /** EnqueueOptions.concurrencyKey, or null. */
  concurrencyKey: string | null;
  /**
   * The enqueue call's own `maxAttempts`, or null: then the statement takes the queue's recorded
   * setting (written by its consumers at boot), else `defaultMaxAttempts`.
   */
  maxAttempts: number | null;
  /** This process's own value for the queue (its `queues` entry or handler, else 25). */
  defaultMaxAttempts: number;
  /**
   * The enqueue's trace context (core/tracing.ts: the propagator's carrier as JSON text, at most
   * MAX_TRACE_CONTEXT_LENGTH characters), stored with the job so that its handler joins the
   * trace; absent or null for none (tracing off, no active trace, a schedule's tick).
   */
  traceContext?: string | null;
}

/**
 * What happens to an ordered group when one of its jobs dies: `continue` runs the next job (the
 * dead one keeps its diagnosis); `block` stops the group until the dead job is retried or purged.
 */
export type GroupOnDead = 'continue' | 'block';

/**
 * What a queue's consumers apply, recorded in the database at their boot so that every process
 * (producers, reapers, other consumers) applies the same.
 */
export interface QueueSetting {
  queue: string;
  maxAttempts: number;
  /** Default 'continue'. */
  groupOnDead?: GroupOnDead;
  /** The queue's flow limits; absent or null: none. */
  limits?: FlowLimits | null;
}

/** A concurrency key's share of its queue now: its leased (running) jobs and its waiting ones. */
export interface FlowKeyUsage {
  key: string;
  running: number;
  waiting: number;
}

/** What a queue's flow limits hold back now (`producer.flowUsage()`; the dashboard's queue page). */
export interface FlowUsage {
  queue: string;
  /** The limits its consumers recorded, or null for none. */
  limits: FlowLimits | null;
  /** Jobs of the queue leased now (what `globalConcurrency` counts). */
  running: number;
  /** Starts in the current `rateLimit` window, or null without one. */
  windowStarts: number | null;
  /** Keys with waiting jobs whose running ones fill `concurrencyPerKey` (null without it). */
  keysAtLimit: number | null;
  /** The busiest keys: most running first, then most waiting. */
  keys: FlowKeyUsage[];
}

/** At most `max` job starts in any window of `perMs` milliseconds (database clock). */
export interface RateLimit {
  max: number;
  perMs: number;
}

/**
 * A queue's flow limits (issue 24), enforced in the database by the claim, so they hold across
 * every instance. Null fields: no such limit.
 */
export interface FlowLimits {
  /** Most jobs of the queue leased at once, across all instances. */
  globalConcurrency: number | null;
  /** Most jobs of one concurrency key leased at once, across all instances. */
  concurrencyPerKey: number | null;
  /** Most job starts of the queue in any window. */
  rateLimit: RateLimit | null;
  /** Most job starts of one concurrency key in any window. */
  rateLimitPerKey: RateLimit | null;
}

export interface EnqueueResult {
  jobId: JobId;
  /** False when a job with the same idempotency key already existed in the queue. */
  created: boolean;
}

/** A job a worker holds: the claim token is its proof of ownership. */
export interface ClaimedJob {
  id: JobId;
  queue: string;
  payload: unknown;
  priority: number;
  groupKey: string | null;
  idempotencyKey: string | null;
  /** 1 for the first run; counts every claim, including ones lost to lease expiry. */
  attempt: number;
  maxAttempts: number;
  claimToken: string;
  enqueuedAt: Date;
  claimedAt: Date;
  leaseUntil: Date;
  /** The trace context stored at enqueue (NewJob.traceContext); absent or null for none. */
  traceContext?: string | null;
}

export interface ClaimRequest {
  queue: string;
  /**
   * Most units to lease: an ungrouped job is one unit, and so is a group batch (the head of an
   * ordered group plus up to `groupBatchSize - 1` following due jobs of that group).
   */
  limit: number;
  /**
   * Most jobs leased from one ordered group in one claim (1: the head only). A group batch comes
   * back as consecutive jobs in id order sharing one claim token, to be run in that order by one
   * reader; a job not due yet (or leased) ends the batch. Default 1.
   */
  groupBatchSize?: number;
  leaseMs: number;
  /** Identifies the worker in the job row and attempt history (host:pid:…); diagnostic only. */
  workerId: string;
  /**
   * This instance applies flow limits to the queue: the claim takes the queue's flow lock and
   * applies the limits its consumers recorded (QueueSetting.limits). Default false; a queue
   * with concurrency keys is claimed through the flow path anyway (keys are taken in turn).
   */
  limited?: boolean;
}

export interface OwnedJob {
  id: JobId;
  claimToken: string;
}

/** A leased job given back to waiting: at once (never started), or after `delayMs` (postponed). */
export interface ReleaseItem extends OwnedJob {
  /** Wait this long before the job is claimable again (0 or absent: at once, in its old place). */
  delayMs?: number;
}

/**
 * A completion: the job, its handler's result as JSON text, and its last progress not written
 * yet (null or absent: none, or nothing new).
 */
export interface CompleteItem extends OwnedJob {
  result?: string | null;
  progress?: string | null;
}

/** The most a job's progress (`context.progress()`) may take as JSON text, in UTF-8 bytes. */
export const MAX_PROGRESS_BYTES = 4 * 1024;

/** The most a handler's result may take as JSON text, in UTF-8 bytes. */
export const MAX_RESULT_BYTES = 1024 * 1024;

export interface HeartbeatItem extends OwnedJob {
  /** The job's progress reported since the last write, as JSON text; absent or null: unchanged. */
  progress?: string | null;
  leaseMs: number;
  /** Upper bound on the lease, counted from the claim; null for none. */
  maxDurationMs: number | null;
}

/**
 * Outcome of a token-checked write.
 * - `ok`: this call changed the row;
 * - `already`: the same token already recorded this outcome (a retry after a lost reply);
 * - `lost`: the worker no longer owns the job; nothing was changed.
 */
export type OwnershipOutcome = 'ok' | 'already' | 'lost';

export interface HeartbeatResult {
  id: JobId;
  outcome: Exclude<OwnershipOutcome, 'already'>;
  leaseUntil: Date | null;
  /** Set when `cancel()` asked for this leased job: its owner aborts the handler and records the cancellation. */
  cancel?: { reason: string | null };
}

export interface CompleteResult {
  id: JobId;
  outcome: OwnershipOutcome;
}

export interface FailItem extends OwnedJob {
  error: string;
  stack: string | null;
  /** Delay before the next attempt, from the retry policy. Ignored when the job goes dead. */
  retryDelayMs: number;
  /** Dead at once, whatever attempts are left (an unrecoverable error). */
  dead: boolean;
  workerId: string;
  /**
   * The owner acknowledges a cancellation (`cancel()` on the leased job): the job becomes
   * `canceled`, its attempt is recorded as canceled, and it is not retried.
   */
  canceled?: boolean;
}

export interface FailResult {
  id: JobId;
  outcome: OwnershipOutcome;
  /**
   * State after the failure: `delayed` (to be retried after its delay), `ready` (to be retried
   * now: no delay), `dead`, or `canceled` (an acknowledged cancellation). Null when lost.
   */
  state: 'ready' | 'delayed' | 'dead' | 'canceled' | null;
}

/**
 * What `cancel()` did to one job:
 * - `canceled`: it was ready or delayed, and is canceled now (it never runs);
 * - `canceling`: it is leased; its owner learns of it on its next heartbeat (or sooner through a
 *   wake-up), aborts the handler and records the attempt as canceled;
 * - `finished`: it had already finished (done, dead or canceled): nothing changed;
 * - `missing`: no such job (never existed, or cleaned up).
 */
export type CancelOutcome = 'canceled' | 'canceling' | 'finished' | 'missing';

export interface CancelResult {
  id: JobId;
  /** The job's queue; null when missing. */
  queue: string | null;
  outcome: CancelOutcome;
  /** The job's state after the call; null when missing. */
  state: JobState | null;
}

export interface ReapedJob {
  id: JobId;
  queue: string;
  /** `canceled`: cancel() had marked it, and its owner never recorded the cancellation. */
  state: 'ready' | 'dead' | 'canceled';
  attempt: number;
}

export interface QueueStats {
  queue: string;
  /** Due now and not leased (ready, or delayed and due but not promoted by a claim yet). */
  ready: number;
  /** Not due yet (delayed enqueues and retries backing off). */
  delayed: number;
  leased: number;
  /** Leased with the lease already past: work the reaper has yet to return. */
  expiredLeases: number;
  dead: number;
  /** Milliseconds since the oldest ready job became due; 0 when none is waiting. */
  oldestReadyAgeMs: number;
  /** Waiting jobs (ready or delayed) that have already failed at least once. */
  retrying: number;
  /** Ordered groups stopped by a dead job (`groupOnDead: 'block'`) until it is retried or purged. */
  blockedGroups: number;
  /** Paused (`pauseQueue`): no instance claims from it until `resumeQueue`. */
  paused: boolean;
}

/** A queue paused with `pauseQueue`, as stored in the database. */
export interface QueuePause {
  queue: string;
  /** What the operator said, or null. */
  reason: string | null;
  /** When the pause was stored (database clock). */
  pausedAt: Date;
}

/** An ordered group stopped by a dead job under `groupOnDead: 'block'`. */
export interface BlockedGroup {
  groupKey: string;
  /** The dead job that blocks the group: retry it (`retryDead`) or purge it to release the group. */
  jobId: JobId;
  /** The dead job's last error. */
  error: string | null;
  /** When the job died. */
  diedAt: Date | null;
}

export interface BlockedGroupPage {
  groups: BlockedGroup[];
  /** Pass as `afterKey` for the next page; null at the end. */
  nextAfterKey: string | null;
}

/** A group whose cached state disagreed with its jobs, found and fixed by the repair sweep. */
export interface GroupRepair {
  queue: string;
  groupKey: string;
  /** What was wrong, for the log line (e.g. "head 12 is not the first unfinished job 10"). */
  problem: string;
}

export type AttemptOutcome = 'failed' | 'lease-expired' | 'canceled' | 'completed';

export interface AttemptRecord {
  attempt: number;
  outcome: AttemptOutcome;
  error: string | null;
  stack: string | null;
  workerId: string | null;
  startedAt: Date | null;
  finishedAt: Date;
}

export interface JobRecord {
  id: JobId;
  queue: string;
  state: JobState;
  payload: unknown;
  priority: number;
  runAt: Date;
  groupKey: string | null;
  idempotencyKey: string | null;
  /** EnqueueOptions.concurrencyKey, or null. */
  concurrencyKey: string | null;
  attempts: number;
  maxAttempts: number;
  claimToken: string | null;
  leaseUntil: Date | null;
  workerId: string | null;
  createdAt: Date;
  claimedAt: Date | null;
  finishedAt: Date | null;
  lastError: string | null;
  /** When `cancel()` was asked for this job (null: never); a leased job keeps running until its owner learns of it. */
  cancelRequestedAt: Date | null;
  cancelReason: string | null;
  /** What the handler returned (parsed JSON), stored with the completion; null when it returned nothing. */
  result: unknown;
  /** The last progress its handler reported (`context.progress()`), as written; null when none. */
  progress: unknown;
}

export interface DeadJobPage {
  jobs: JobRecord[];
  /** Pass as `afterId` for the next page; null at the end. */
  nextAfterId: JobId | null;
}

export interface CleanupRequest {
  /** Delete done jobs finished longer ago than this. */
  doneRetentionMs: number;
  /** Delete dead jobs finished longer ago than this; null keeps them until purged. */
  deadRetentionMs: number | null;
  /** Keep a finished job with an idempotency key at least this long, so the key still dedupes. */
  idempotencyRetentionMs: number;
  batchSize: number;
}

// ---- Health and measurements -------------------------------------------------------------

/** What `QueueStore.queueHealth` counts besides the live figures of `QueueStats`. */
export interface QueueHealthRequest {
  /** Attempts that ended (failed or lease expired) within this many milliseconds count as recent. */
  failureWindowMs: number;
  /** An unfinished job that has already failed at least this many times counts as repeatedly failing. */
  repeatedFailures: number;
}

/**
 * One queue's figures, as read for every queue at once by `QueueStore.queueHealth`. The live
 * figures mean what they mean in `QueueStats`; the rest come from the attempt history.
 */
export interface QueueHealth extends QueueStats {
  /** Attempts that failed (handler error, timeout, unrecoverable) within the window, on every worker. */
  recentFailures: number;
  /** Leases the reaper found expired within the window (a worker crashed, hung or lost the database). */
  recentLeaseExpiries: number;
  /**
   * Jobs not finished yet (ready, delayed or leased) that have already failed at least
   * `repeatedFailures` times: the ones a queue length hides.
   */
  repeatedlyFailing: number;
}

// ---- Browsing jobs and counting outcomes (the dashboard) ---------------------------------

/**
 * One page of a queue's jobs in one state. Each state is read through the index that already
 * serves it, in that index's order, so a page costs about `limit` index entries:
 * - ready: claim order (priority descending, run time, id) for jobs outside ordered groups,
 *   then grouped ready jobs by group key and id;
 * - delayed: by run time and id, ungrouped first, then grouped by group key and id;
 * - leased: by lease end (soonest first), then id;
 * - dead: newest first (id descending);
 * - done: most recently finished first, looked up among at most `DONE_SCAN_LIMIT` most recent
 *   completions of all queues (done jobs are not indexed by queue): `scanLimited` says the page
 *   may miss older ones.
 *
 * Grouped ready and delayed jobs share one index with each other and with leased ones (state is
 * not among its keys), so a request reads at most `GROUP_SCAN_LIMIT` of its entries, from the
 * cursor on, and keeps those in the state asked for. When that read ends before the page is
 * full, the page holds the jobs it found (possibly none) and `nextCursor` points after the last
 * entry read: a page can hold fewer than `limit` jobs, or none, and still have a next page.
 * Following the cursors lists every job once, none skipped or repeated, each request bounded.
 */
export interface JobListRequest {
  queue: string;
  state: ListedJobState;
  /** 1..500. */
  limit: number;
  /** `nextCursor` of the page before; null or absent for the first page. Opaque to callers. */
  cursor?: string | null;
}

/** Most recent completions (all queues) a done-jobs page looks through. */
export const DONE_SCAN_LIMIT = 10_000;

/** Entries of the ordered-group index (all of a queue's unfinished grouped jobs) one ready or delayed page reads. */
export const GROUP_SCAN_LIMIT = 2_000;

/** Characters of payload JSON and of the last error a listed job carries (the job detail has all). */
export const JOB_PREVIEW_CHARS = 200;

/** A job as listed: its record without the payload, last error and token, with short previews. */
export interface JobSummary extends Omit<
  JobRecord,
  | 'payload'
  | 'claimToken'
  | 'lastError'
  | 'cancelRequestedAt'
  | 'cancelReason'
  | 'result'
  | 'progress'
  | 'concurrencyKey'
> {
  /** The first `JOB_PREVIEW_CHARS` characters of the payload's JSON text. */
  payloadPreview: string;
  /** The first `JOB_PREVIEW_CHARS` characters of the last error, or null. */
  lastErrorPreview: string | null;
}

export interface JobListPage {
  jobs: JobSummary[];
  /**
   * Pass as `cursor` for the next page; null at the end. Not null on a short or empty page of
   * ready or delayed jobs whose grouped look-up stopped at GROUP_SCAN_LIMIT entries: the next
   * page continues it.
   */
  nextCursor: string | null;
  /** Done jobs only: the look-up stopped at DONE_SCAN_LIMIT completions; older done jobs of the queue are not listed. */
  scanLimited: boolean;
}

/** Outcomes one process counted for one queue since its last flush. */
export interface ThroughputCount {
  queue: string;
  /** Jobs completed. */
  completed: number;
  /** Attempts that failed and will be retried. */
  failed: number;
  /** Jobs that went dead (out of attempts, or unrecoverable). */
  dead: number;
  /**
   * Milliseconds the completed jobs took from claim to done (their handlers' run): with
   * `completed`, the run time the scale recommendation sizes readers by. Absent: 0.
   */
  busyMs?: number;
}

/** One queue's outcomes in one minute (database clock), summed over every process. */
export interface ThroughputBucket extends ThroughputCount {
  /** Start of the minute. */
  minute: Date;
}

export interface ThroughputReading {
  /** The database's clock when read. */
  now: Date;
  /** Oldest first; minutes without outcomes are absent. */
  buckets: ThroughputBucket[];
}

/** How long per-minute throughput buckets are kept (the reaper's cleanup deletes older ones). */
export const THROUGHPUT_RETENTION_MS = 24 * 60 * 60 * 1000;
