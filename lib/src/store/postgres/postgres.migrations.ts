import { assertPrincipalName } from '../../core/validation.js';
import { quotePgIdentifier } from './postgres.identifiers.js';
import { pgEnqueueFunction, pgEnqueueSignature } from './queries/enqueue-function.queries.js';
import { pgDesiredReadersFunction, pgDesiredReadersSignature } from './queries/scaling.queries.js';
import { pgTables } from './queries/tables.js';

export interface PgMigration {
  version: number;
  description: string;
  statements: (schema: string) => string[];
}

/**
 * Append-only: a released migration is never edited; changes come as a new version.
 *
 * Index design: every hot path reads a partial index whose predicate names a live state, so
 * finished history (done rows, millions of them) never sits in the claim, reaper or stats path.
 */
export const PG_MIGRATIONS: readonly PgMigration[] = [
  {
    version: 1,
    description: 'jobs, attempts and their indexes',
    statements: (schema) => {
      const s = quotePgIdentifier(schema);
      return [
        `CREATE SEQUENCE ${s}.jobs_id_seq AS bigint`,
        `CREATE TABLE ${s}.jobs (
  id bigint NOT NULL DEFAULT nextval('${s}.jobs_id_seq'),
  queue varchar(128) NOT NULL,
  state varchar(8) NOT NULL,
  payload jsonb NOT NULL,
  priority integer NOT NULL DEFAULT 0,
  run_at timestamptz NOT NULL,
  group_key varchar(255) NULL,
  idempotency_key varchar(255) NULL,
  attempts integer NOT NULL DEFAULT 0,
  max_attempts integer NOT NULL,
  claim_token uuid NULL,
  lease_until timestamptz NULL,
  worker_id varchar(255) NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  claimed_at timestamptz NULL,
  finished_at timestamptz NULL,
  last_error text NULL,
  CONSTRAINT jobs_pk PRIMARY KEY (id),
  CONSTRAINT jobs_state_ck CHECK (state IN ('ready', 'leased', 'done', 'dead')),
  CONSTRAINT jobs_attempts_ck CHECK (attempts >= 0 AND max_attempts >= 1)
)`,
        `ALTER SEQUENCE ${s}.jobs_id_seq OWNED BY ${s}.jobs.id`,
        // The claim reads this index in its ORDER BY order and stops after LIMIT rows.
        `CREATE INDEX jobs_claim_ix ON ${s}.jobs (queue, priority DESC, run_at, id) WHERE state = 'ready'`,
        // Reaper and lease stats: leased rows are few (bounded by running handlers).
        `CREATE INDEX jobs_leased_ix ON ${s}.jobs (queue, lease_until) WHERE state = 'leased'`,
        `CREATE INDEX jobs_dead_ix ON ${s}.jobs (queue, id) WHERE state = 'dead'`,
        // Retention cleanup deletes the oldest finished rows first.
        `CREATE INDEX jobs_done_ix ON ${s}.jobs (finished_at) WHERE state = 'done'`,
        `CREATE UNIQUE INDEX jobs_idempotency_ux ON ${s}.jobs (queue, idempotency_key) WHERE idempotency_key IS NOT NULL`,
        `CREATE TABLE ${s}.attempts (
  id bigint GENERATED ALWAYS AS IDENTITY,
  job_id bigint NOT NULL,
  queue varchar(128) NOT NULL,
  attempt integer NOT NULL,
  outcome varchar(16) NOT NULL,
  error text NULL,
  stack text NULL,
  worker_id varchar(255) NULL,
  claim_token uuid NULL,
  started_at timestamptz NULL,
  finished_at timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT attempts_pk PRIMARY KEY (id),
  CONSTRAINT attempts_job_fk FOREIGN KEY (job_id) REFERENCES ${s}.jobs (id) ON DELETE CASCADE,
  CONSTRAINT attempts_outcome_ck CHECK (outcome IN ('failed', 'lease-expired'))
)`,
        `CREATE INDEX attempts_job_ix ON ${s}.attempts (job_id, attempt)`,
        `CREATE INDEX attempts_recent_ix ON ${s}.attempts (queue, finished_at)`,
      ];
    },
  },
  {
    version: 2,
    description: 'queue settings recorded by consumers',
    // The maxAttempts a queue's consumers apply (their handler's), written at their boot and
    // read by every enqueue that does not give its own, so a producer-only process stores it too.
    statements: (schema) => [
      `CREATE TABLE ${quotePgIdentifier(schema)}.queue_settings (
  queue varchar(128) NOT NULL,
  max_attempts integer NOT NULL,
  updated_at timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT queue_settings_pk PRIMARY KEY (queue),
  CONSTRAINT queue_settings_max_attempts_ck CHECK (max_attempts >= 1)
)`,
    ],
  },
  {
    version: 3,
    description: 'delayed jobs wait outside the ready index',
    // Review P2: a job not due yet sat in jobs_claim_ix, so every claim read (and skipped) the
    // delayed rows of higher priorities before reaching due rows of lower ones. It now waits as
    // 'delayed' in an index of its own, read oldest first by the claim that promotes it.
    // 'delayed' fits the varchar(8) state column. Ready rows not due yet move over here, in the
    // migration's transaction; the CHECK re-validation scans the table once.
    statements: (schema) => {
      const s = quotePgIdentifier(schema);
      return [
        `ALTER TABLE ${s}.jobs DROP CONSTRAINT jobs_state_ck,
  ADD CONSTRAINT jobs_state_ck CHECK (state IN ('ready', 'delayed', 'leased', 'done', 'dead'))`,
        `CREATE INDEX jobs_delayed_ix ON ${s}.jobs (queue, run_at, id) WHERE state = 'delayed'`,
        `UPDATE ${s}.jobs SET state = 'delayed' WHERE state = 'ready' AND run_at > now()`,
      ];
    },
  },
  {
    version: 4,
    description: 'ordered groups',
    // Seed 002 on the table queue: one row per active group holds the group's lease
    // (held_token = the claim token of its leased jobs) and a cached head (its lowest unfinished
    // job). Claims lock and skip group rows only, through groups_claim_ix, so their cost follows
    // claimable groups, never the jobs queued behind a head. Grouped jobs leave the ungrouped claim
    // and delayed indexes; jobs_group_ix serves every per-group lookup. Existing grouped jobs get
    // their group rows here, in the migration's transaction: nothing in flight is lost or reordered.
    statements: (schema) => {
      const s = quotePgIdentifier(schema);
      return [
        `CREATE TABLE ${s}.groups (
  queue varchar(128) NOT NULL,
  group_key varchar(255) NOT NULL,
  head_id bigint NULL,
  head_ready_at timestamptz NULL,
  head_priority integer NULL,
  -- The head was not due when it was set (a delayed job, a retry backing off): it waits in
  -- groups_waiting_ix, outside the claim's ordered index, until a claim after its time promotes it.
  waiting boolean NOT NULL DEFAULT false,
  held_token uuid NULL,
  blocked boolean NOT NULL DEFAULT false,
  updated_at timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT groups_pk PRIMARY KEY (queue, group_key)
) WITH (fillfactor = 70)`,
        // Every transition rewrites the row and these columns are indexed (no HOT updates): room
        // on the page and eager vacuuming keep the table and its index small under churn.
        `ALTER TABLE ${s}.groups SET (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000)`,
        `CREATE INDEX groups_claim_ix ON ${s}.groups (queue, head_priority DESC, head_ready_at, head_id)
  WHERE held_token IS NULL AND head_id IS NOT NULL AND NOT blocked AND NOT waiting`,
        `CREATE INDEX groups_waiting_ix ON ${s}.groups (queue, head_ready_at, head_id)
  WHERE held_token IS NULL AND head_id IS NOT NULL AND NOT blocked AND waiting`,
        `CREATE INDEX groups_blocked_ix ON ${s}.groups (queue, group_key) WHERE blocked`,
        `DROP INDEX ${s}.jobs_claim_ix`,
        `CREATE INDEX jobs_claim_ix ON ${s}.jobs (queue, priority DESC, run_at, id) WHERE state = 'ready' AND group_key IS NULL`,
        `DROP INDEX ${s}.jobs_delayed_ix`,
        `CREATE INDEX jobs_delayed_ix ON ${s}.jobs (queue, run_at, id) WHERE state = 'delayed' AND group_key IS NULL`,
        `CREATE INDEX jobs_group_ix ON ${s}.jobs (queue, group_key, id)
  WHERE group_key IS NOT NULL AND state IN ('ready', 'delayed', 'leased')`,
        // A group's leased jobs by their token (the jobs of one group batch): whether the group is
        // still held, and which batch jobs go back with a failure, without walking a deep group.
        `CREATE INDEX jobs_batch_ix ON ${s}.jobs (claim_token) WHERE state = 'leased' AND group_key IS NOT NULL`,
        `ALTER TABLE ${s}.queue_settings ADD COLUMN group_on_dead varchar(8) NOT NULL DEFAULT 'continue',
  ADD CONSTRAINT queue_settings_group_on_dead_ck CHECK (group_on_dead IN ('continue', 'block'))`,
        // Before version 4 a group's jobs could be leased together; the lowest leased one's token
        // holds the group, and the others finish without moving it (they do not hold it).
        `INSERT INTO ${s}.groups (queue, group_key, head_id, head_ready_at, head_priority, waiting, held_token)
SELECT DISTINCT ON (queue, group_key) queue, group_key, id, run_at, priority, run_at > now(),
       (SELECT l.claim_token FROM ${s}.jobs l
        WHERE l.queue = j.queue AND l.group_key = j.group_key AND l.state = 'leased' ORDER BY l.id LIMIT 1)
FROM ${s}.jobs j
WHERE group_key IS NOT NULL AND state IN ('ready', 'delayed', 'leased')
ORDER BY queue, group_key, id`,
      ];
    },
  },
  {
    version: 5,
    description: 'recurring jobs',
    // One row per schedule (issue 13). Payload and options are the JSON text core wrote, kept
    // verbatim. The scheduler's idle poll reads min(next_run_at) of unpaused rows and its firing
    // locks the due ones in next_run_at order: both walk schedules_due_ix only.
    statements: (schema) => {
      const s = quotePgIdentifier(schema);
      return [
        `CREATE TABLE ${s}.schedules (
  id varchar(128) NOT NULL,
  queue varchar(128) NOT NULL,
  cron varchar(255) NOT NULL,
  timezone varchar(128) NOT NULL,
  payload text NOT NULL,
  options text NOT NULL,
  catch_up varchar(4) NOT NULL,
  paused boolean NOT NULL DEFAULT false,
  source varchar(8) NOT NULL,
  next_run_at timestamptz NULL,
  last_run_at timestamptz NULL,
  last_tick timestamptz NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT schedules_pk PRIMARY KEY (id),
  CONSTRAINT schedules_catch_up_ck CHECK (catch_up IN ('none', 'last', 'all')),
  CONSTRAINT schedules_source_ck CHECK (source IN ('options', 'api'))
)`,
        `CREATE INDEX schedules_due_ix ON ${s}.schedules (next_run_at) WHERE NOT paused AND next_run_at IS NOT NULL`,
      ];
    },
  },
  {
    version: 6,
    description: 'throughput',
    // Per-minute outcome counts per queue (the dashboard's chart), added to by every process's
    // flush. Keyed by minute first: the read of the last N minutes and the retention delete are
    // both one range of the primary key, whatever the number of queues.
    statements: (schema) => [
      `CREATE TABLE ${quotePgIdentifier(schema)}.throughput (
  minute timestamptz NOT NULL,
  queue varchar(128) NOT NULL,
  completed bigint NOT NULL DEFAULT 0,
  failed bigint NOT NULL DEFAULT 0,
  dead bigint NOT NULL DEFAULT 0,
  CONSTRAINT throughput_pk PRIMARY KEY (minute, queue)
)`,
    ],
  },
  {
    version: 7,
    description: 'trace context',
    // The enqueue's trace context (issue 15): the propagator's carrier as JSON text, read back by
    // the claim so the handler's span joins the producer's trace. A nullable column without a
    // default is a catalog change only: no table rewrite, however many jobs there are.
    statements: (schema) => [
      `ALTER TABLE ${quotePgIdentifier(schema)}.jobs ADD COLUMN trace_context varchar(2048) NULL`,
    ],
  },
  {
    version: 8,
    description: 'queue pauses',
    // One row per paused queue (issue 23). Every claim of a queue probes its row (the primary
    // key), so a pause holds on every instance from its commit; a new table, so an instance of
    // the previous release (which never reads it) keeps claiming until it is upgraded.
    statements: (schema) => [
      `CREATE TABLE ${quotePgIdentifier(schema)}.queue_pauses (
  queue varchar(128) NOT NULL,
  reason varchar(1000) NULL,
  paused_at timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT queue_pauses_pk PRIMARY KEY (queue)
)`,
    ],
  },
  {
    version: 9,
    description: 'job cancellation',
    // cancel() (issue 23): a ready or delayed job becomes 'canceled' (final); a leased one gets
    // cancel_requested_at, which heartbeats report to its owner. Nullable columns without a
    // default are catalog changes only. The state check is re-created with the new state and
    // checked against every row once (as version 3 did); canceled jobs get the retention index
    // done jobs have. Instances of the previous release never write or read 'canceled': their
    // claims skip canceled jobs (not ready), their heartbeats ignore a cancel request (the job
    // then runs to its end there, and is canceled by nobody).
    statements: (schema) => {
      const s = quotePgIdentifier(schema);
      return [
        `ALTER TABLE ${s}.jobs ADD COLUMN cancel_requested_at timestamptz NULL, ADD COLUMN cancel_reason varchar(1000) NULL`,
        `ALTER TABLE ${s}.jobs DROP CONSTRAINT jobs_state_ck,
  ADD CONSTRAINT jobs_state_ck CHECK (state IN ('ready', 'delayed', 'leased', 'done', 'dead', 'canceled'))`,
        `ALTER TABLE ${s}.attempts DROP CONSTRAINT attempts_outcome_ck,
  ADD CONSTRAINT attempts_outcome_ck CHECK (outcome IN ('failed', 'lease-expired', 'canceled'))`,
        `CREATE INDEX jobs_canceled_ix ON ${s}.jobs (finished_at) WHERE state = 'canceled'`,
      ];
    },
  },
  {
    version: 10,
    description: 'job results and progress',
    // A handler's return value, written by the completion statement, and its last reported
    // progress, written by heartbeats and the completion (issue 23). Nullable columns without a
    // default: catalog changes only.
    statements: (schema) => [
      `ALTER TABLE ${quotePgIdentifier(schema)}.jobs ADD COLUMN result jsonb NULL, ADD COLUMN progress jsonb NULL`,
    ],
  },
  {
    version: 11,
    description: 'flow control',
    // Issue 24. A job's concurrency key; the limits its queue's consumers recorded; and one
    // flow_state row per limited queue (lane '') and per rate-limited key (lane = the key): the
    // queue row is the lock every flow claim of the queue takes, and holds the round-robin cursor
    // and the starts of the rate window. Keyed ready jobs leave the ungrouped claim index for one
    // ordered by key, so a claim can step from key to key (one index descent each) and a key with
    // a million jobs is one key; their leased rows are counted per key for the slots. The claim
    // index is rebuilt in the migration's transaction (as version 4 did): no job in flight moves.
    statements: (schema) => {
      const s = quotePgIdentifier(schema);
      return [
        `ALTER TABLE ${s}.jobs ADD COLUMN concurrency_key varchar(255) NULL`,
        `ALTER TABLE ${s}.queue_settings ADD COLUMN global_concurrency integer NULL,
  ADD COLUMN concurrency_per_key integer NULL,
  ADD COLUMN rate_max integer NULL, ADD COLUMN rate_per_ms integer NULL,
  ADD COLUMN key_rate_max integer NULL, ADD COLUMN key_rate_per_ms integer NULL`,
        `CREATE TABLE ${s}.flow_state (
  queue varchar(128) NOT NULL,
  lane varchar(255) NOT NULL,
  cursor_key varchar(255) NULL,
  starts timestamptz[] NOT NULL DEFAULT '{}',
  blocked_until timestamptz NULL,
  updated_at timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT flow_state_pk PRIMARY KEY (queue, lane)
)`,
        `DROP INDEX ${s}.jobs_claim_ix`,
        `CREATE INDEX jobs_claim_ix ON ${s}.jobs (queue, priority DESC, run_at, id)
  WHERE state = 'ready' AND group_key IS NULL AND concurrency_key IS NULL`,
        `CREATE INDEX jobs_key_ready_ix ON ${s}.jobs (queue, concurrency_key, priority DESC, run_at, id)
  WHERE state = 'ready' AND concurrency_key IS NOT NULL`,
        `CREATE INDEX jobs_key_leased_ix ON ${s}.jobs (queue, concurrency_key)
  WHERE state = 'leased' AND concurrency_key IS NOT NULL`,
      ];
    },
  },
  {
    version: 12,
    description: 'enqueue from SQL',
    // Issue 25: <schema>.enqueue(...), producer.enqueue for triggers, procedures and scripts
    // (queries/enqueue-function.queries.ts). Built from the store's enqueue statements as they are
    // at this release: a test pins this version's text, so a later change to those statements
    // freezes this text here and replaces the function in a new version. EXECUTE is revoked from
    // PUBLIC (a SECURITY DEFINER function is callable by everyone by default): granted per role.
    statements: (schema) => [
      pgEnqueueFunction(pgTables(schema)),
      `REVOKE ALL ON FUNCTION ${pgEnqueueSignature(schema)} FROM PUBLIC`,
    ],
  },
  {
    version: 13,
    description: 'scale recommendation',
    // Issue 26: the completed jobs' handler time per minute (busy_ms, the run time the scale
    // recommendation sizes readers by; a constant default adds the column without a rewrite), and
    // <schema>.desired_readers(queue_name, ...), what KEDA's postgresql scaler queries
    // (queries/scaling.queries.ts). Built from the scale statement as it is at this release and
    // pinned as version 12 is: a later change replaces the function in a new version. EXECUTE
    // revoked from PUBLIC.
    statements: (schema) => [
      `ALTER TABLE ${quotePgIdentifier(schema)}.throughput ADD COLUMN busy_ms bigint NOT NULL DEFAULT 0`,
      pgDesiredReadersFunction(pgTables(schema)),
      `REVOKE ALL ON FUNCTION ${pgDesiredReadersSignature(schema)} FROM PUBLIC`,
    ],
  },
];

export const PG_LATEST_VERSION = PG_MIGRATIONS[PG_MIGRATIONS.length - 1]!.version;

/** Statements that must exist before the version can be read; safe to repeat. */
export function pgBootstrap(schema: string): string[] {
  const s = quotePgIdentifier(schema);
  return [
    `CREATE SCHEMA IF NOT EXISTS ${s}`,
    `CREATE TABLE IF NOT EXISTS ${s}.schema_version (
  version integer NOT NULL PRIMARY KEY,
  description text NOT NULL,
  applied_at timestamptz NOT NULL DEFAULT now()
)`,
  ];
}

/** One advisory-lock key per schema, so installs in different schemas do not wait on each other. */
export function pgMigrationLockKey(schema: string): string {
  return `nestjs-sql-queue:migrate:${schema}`;
}

/** The install/upgrade script a DBA can review and run with psql. */
export function pgInstallScript(schema: string, fromVersion = 0): string {
  const s = quotePgIdentifier(schema);
  const lines = [
    fromVersion >= PG_LATEST_VERSION
      ? `-- nestjs-sql-queue schema for PostgreSQL, schema ${schema}: already at version ${PG_LATEST_VERSION}, nothing to apply`
      : `-- nestjs-sql-queue schema for PostgreSQL, versions ${fromVersion + 1}..${PG_LATEST_VERSION}, schema ${schema}`,
    'BEGIN;',
    `SELECT pg_advisory_xact_lock(hashtext('${pgMigrationLockKey(schema)}'));`,
    ...pgBootstrap(schema).map((statement) => `${statement};`),
  ];
  for (const migration of PG_MIGRATIONS.filter((m) => m.version > fromVersion)) {
    lines.push(`-- ${migration.version}: ${migration.description}`);
    lines.push(...migration.statements(schema).map((statement) => `${statement};`));
    lines.push(
      `INSERT INTO ${s}.schema_version (version, description) VALUES (${migration.version}, '${migration.description.replace(/'/g, "''")}');`,
    );
  }
  lines.push('COMMIT;');
  return `${lines.join('\n')}\n`;
}

/**
 * What a role needs to call <schema>.enqueue and nothing else (the function is SECURITY DEFINER):
 * USAGE on the schema, to name the function, and EXECUTE on it. Safe to run again.
 */
export function pgEnqueueGrantsScript(schema: string, principal: string): string {
  const role = quotePgIdentifier(assertPrincipalName('enqueuers', principal));
  return `-- Lets ${role} call ${quotePgIdentifier(schema)}.enqueue(...) and nothing else (no table rights).
GRANT USAGE ON SCHEMA ${quotePgIdentifier(schema)} TO ${role};
GRANT EXECUTE ON FUNCTION ${pgEnqueueSignature(schema)} TO ${role};
`;
}

/**
 * What an autoscaler's login needs to query <schema>.desired_readers and nothing else (the
 * function is SECURITY DEFINER): USAGE on the schema and EXECUTE on it. Safe to run again.
 */
export function pgScalerGrantsScript(schema: string, principal: string): string {
  const role = quotePgIdentifier(assertPrincipalName('scalers', principal));
  return `-- Lets ${role} read ${quotePgIdentifier(schema)}.desired_readers(...) and nothing else (KEDA's postgresql scaler).
GRANT USAGE ON SCHEMA ${quotePgIdentifier(schema)} TO ${role};
GRANT EXECUTE ON FUNCTION ${pgDesiredReadersSignature(schema)} TO ${role};
`;
}
