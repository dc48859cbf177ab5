import { quoteMssqlIdentifier } from './mssql.identifiers.js';
import { MSSQL_TABLE_TYPES } from './mssql.queries.js';
import { assertPrincipalName } from '../../core/validation.js';
import { mssqlEnqueueProcedure, mssqlEnqueueProcedureName } from './queries/enqueue-procedure.queries.js';
import { mssqlDesiredReadersName, mssqlDesiredReadersProcedure } from './queries/scaling.queries.js';
import { mssqlTables } from './queries/tables.js';

export interface MssqlMigration {
  version: number;
  description: string;
  /** Each entry is sent as its own batch, inside the migration transaction. */
  batches: (schema: string) => string[];
}

/**
 * Append-only: a released migration is never edited; changes come as a new version.
 *
 * Clustered key: `Id` (bigint, ever increasing). Ids are reserved from a sequence with
 * sp_sequence_get_range, so a bulk enqueue knows each input row's id before inserting it.
 * Alternatives considered:
 * - clustering on the claim order (Queue, State, Priority, RunAt) would move the whole row,
 *   payload included, on every state change, and scatter inserts over the tree;
 * - a GUID key fragments pages and widens every secondary index.
 * An increasing key appends at the right edge of the tree, which concentrates concurrent
 * inserts on the last page (PAGELATCH_EX contention); OPTIMIZE_FOR_SEQUENTIAL_KEY
 * (SQL Server 2019+, Azure SQL) throttles that, and is switched on where the server has it.
 *
 * Claim path: readers never scan the clustered index. Each hot statement reads a filtered
 * index whose predicate names a live state (ready, leased, dead), so the millions of done rows
 * that accumulate as history are not in the claim, reaper or stats path at all, and a claim
 * is a short ordered range seek that stops after TOP (@limit) rows. Filtered indexes need the
 * standard session settings (ANSI_NULLS, QUOTED_IDENTIFIER, ARITHABORT… ON), which every
 * current driver uses; a session with legacy settings fails loudly (error 1934), not silently.
 *
 * Text keys (queue, idempotency key, group key) use a binary collation, so they compare
 * exactly as in PostgreSQL: 'Order-1' and 'order-1' are different keys whatever the
 * database's default (usually case-insensitive) collation is.
 */
/** The tables whose every index keeps page locks off from version 10 on (READPAST reads them). */
export const MSSQL_ROW_LOCKED_TABLES = ['Jobs', 'Groups', 'Schedules'] as const;

/** Migration 11 keeps a dead message's body up to this many bytes (BROKER_MOVE_MAX_KEPT_BYTES, checked by a unit test). */
export const MIGRATED_BODY_MAX_BYTES = 64 * 1024 * 1024;

/**
 * Migration 11's MaxAttempts of a moved dead message: a broker handler's default (5), or its
 * attempts when more, so a retried one gets the runs a moved message gets (retryDead resets
 * Attempts only), not the old row's count (0 for a message dead with its conversation).
 */
export const MIGRATED_MAX_ATTEMPTS = 5;

export const MSSQL_MIGRATIONS: readonly MssqlMigration[] = [
  {
    version: 1,
    description: 'jobs, attempts, table types and their indexes',
    batches: (schema) => {
      const s = quoteMssqlIdentifier(schema);
      return [
        `CREATE SEQUENCE ${s}.[JobIdSequence] AS bigint START WITH 1 INCREMENT BY 1 CACHE 1000;`,
        `CREATE TABLE ${s}.[Jobs] (
  [Id] bigint NOT NULL,
  [Queue] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL,
  [State] varchar(8) NOT NULL,
  [Payload] nvarchar(max) NOT NULL,
  [Priority] int NOT NULL CONSTRAINT [DF_Jobs_Priority] DEFAULT (0),
  [RunAt] datetime2(3) NOT NULL,
  [GroupKey] nvarchar(255) COLLATE Latin1_General_100_BIN2 NULL,
  [IdempotencyKey] nvarchar(255) COLLATE Latin1_General_100_BIN2 NULL,
  [Attempts] int NOT NULL CONSTRAINT [DF_Jobs_Attempts] DEFAULT (0),
  [MaxAttempts] int NOT NULL,
  [ClaimToken] uniqueidentifier NULL,
  [LeaseUntil] datetime2(3) NULL,
  [WorkerId] nvarchar(255) NULL,
  [CreatedAt] datetime2(3) NOT NULL CONSTRAINT [DF_Jobs_CreatedAt] DEFAULT (SYSUTCDATETIME()),
  [ClaimedAt] datetime2(3) NULL,
  [FinishedAt] datetime2(3) NULL,
  [LastError] nvarchar(max) NULL,
  CONSTRAINT [PK_Jobs] PRIMARY KEY CLUSTERED ([Id]),
  CONSTRAINT [CK_Jobs_State] CHECK ([State] IN ('ready', 'leased', 'done', 'dead')),
  CONSTRAINT [CK_Jobs_Attempts] CHECK ([Attempts] >= 0 AND [MaxAttempts] >= 1)
);`,
        // READPAST skips row locks, never a table lock: a bulk statement that escalated to one
        // would stall every claim until it commits (possibly in a caller's long transaction).
        `ALTER TABLE ${s}.[Jobs] SET (LOCK_ESCALATION = DISABLE);`,
        `IF CAST(SERVERPROPERTY('ProductMajorVersion') AS int) >= 15 OR CAST(SERVERPROPERTY('EngineEdition') AS int) IN (5, 8)
  EXEC (N'ALTER INDEX [PK_Jobs] ON ${s}.[Jobs] SET (OPTIMIZE_FOR_SEQUENTIAL_KEY = ON);');`,
        // Read in ORDER BY order by the claim, which stops after TOP (@limit) rows.
        `CREATE NONCLUSTERED INDEX [IX_Jobs_Claim] ON ${s}.[Jobs] ([Queue], [Priority] DESC, [RunAt], [Id]) WHERE [State] = 'ready';`,
        // Reaper and lease stats: leased rows are few (bounded by running handlers).
        `CREATE NONCLUSTERED INDEX [IX_Jobs_Leased] ON ${s}.[Jobs] ([Queue], [LeaseUntil]) WHERE [State] = 'leased';`,
        `CREATE NONCLUSTERED INDEX [IX_Jobs_Dead] ON ${s}.[Jobs] ([Queue], [Id]) WHERE [State] = 'dead';`,
        // Retention cleanup deletes the oldest finished rows first.
        `CREATE NONCLUSTERED INDEX [IX_Jobs_Done] ON ${s}.[Jobs] ([FinishedAt]) WHERE [State] = 'done';`,
        `CREATE UNIQUE NONCLUSTERED INDEX [UX_Jobs_Idempotency] ON ${s}.[Jobs] ([Queue], [IdempotencyKey]) WHERE [IdempotencyKey] IS NOT NULL;`,
        `CREATE TABLE ${s}.[Attempts] (
  [Id] bigint IDENTITY(1, 1) NOT NULL,
  [JobId] bigint NOT NULL,
  [Queue] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL,
  [Attempt] int NOT NULL,
  [Outcome] varchar(16) NOT NULL,
  [Error] nvarchar(max) NULL,
  [Stack] nvarchar(max) NULL,
  [WorkerId] nvarchar(255) NULL,
  [ClaimToken] uniqueidentifier NULL,
  [StartedAt] datetime2(3) NULL,
  [FinishedAt] datetime2(3) NOT NULL CONSTRAINT [DF_Attempts_FinishedAt] DEFAULT (SYSUTCDATETIME()),
  CONSTRAINT [PK_Attempts] PRIMARY KEY CLUSTERED ([Id]),
  CONSTRAINT [FK_Attempts_Jobs] FOREIGN KEY ([JobId]) REFERENCES ${s}.[Jobs] ([Id]) ON DELETE CASCADE,
  CONSTRAINT [CK_Attempts_Outcome] CHECK ([Outcome] IN ('failed', 'lease-expired'))
);`,
        `ALTER TABLE ${s}.[Attempts] SET (LOCK_ESCALATION = DISABLE);`,
        `CREATE NONCLUSTERED INDEX [IX_Attempts_Job] ON ${s}.[Attempts] ([JobId], [Attempt]);`,
        `CREATE NONCLUSTERED INDEX [IX_Attempts_Recent] ON ${s}.[Attempts] ([Queue], [FinishedAt]);`,
        // Table-valued parameters carry batches in one round trip at any compatibility level.
        `CREATE TYPE ${s}.[JobInputList] AS TABLE (
  [Ord] int NOT NULL PRIMARY KEY,
  [Queue] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL,
  [Payload] nvarchar(max) NOT NULL,
  [Priority] int NOT NULL,
  [RunAt] datetime2(3) NULL,
  [DelayMs] bigint NOT NULL,
  [GroupKey] nvarchar(255) COLLATE Latin1_General_100_BIN2 NULL,
  [IdempotencyKey] nvarchar(255) COLLATE Latin1_General_100_BIN2 NULL,
  [MaxAttempts] int NOT NULL
);`,
        `CREATE TYPE ${s}.[OwnedJobList] AS TABLE (
  [Id] bigint NOT NULL PRIMARY KEY,
  [Token] uniqueidentifier NOT NULL
);`,
        `CREATE TYPE ${s}.[HeartbeatList] AS TABLE (
  [Id] bigint NOT NULL PRIMARY KEY,
  [Token] uniqueidentifier NOT NULL,
  [LeaseMs] int NOT NULL,
  [MaxMs] int NULL
);`,
        `CREATE TYPE ${s}.[FailureList] AS TABLE (
  [Id] bigint NOT NULL PRIMARY KEY,
  [Token] uniqueidentifier NOT NULL,
  [Error] nvarchar(max) NULL,
  [Stack] nvarchar(max) NULL,
  [DelayMs] int NOT NULL,
  [Dead] bit NOT NULL,
  [WorkerId] nvarchar(255) NULL
);`,
        `CREATE TYPE ${s}.[IdList] AS TABLE (
  [Id] bigint NOT NULL PRIMARY KEY
);`,
      ];
    },
  },
  {
    version: 2,
    description: 'queue settings recorded by consumers',
    batches: (schema) => {
      const s = quoteMssqlIdentifier(schema);
      return [
        // The maxAttempts a queue's consumers apply (their handler's), written at their boot and
        // read by every enqueue that does not give its own, so a producer-only process stores it too.
        `CREATE TABLE ${s}.[QueueSettings] (
  [Queue] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL,
  [MaxAttempts] int NOT NULL,
  [UpdatedAt] datetime2(3) NOT NULL CONSTRAINT [DF_QueueSettings_UpdatedAt] DEFAULT (SYSUTCDATETIME()),
  CONSTRAINT [PK_QueueSettings] PRIMARY KEY CLUSTERED ([Queue]),
  CONSTRAINT [CK_QueueSettings_MaxAttempts] CHECK ([MaxAttempts] >= 1)
);`,
        // JobInputList with [MaxAttempts] nullable (null: the queue's setting) and the producer's
        // own default beside it. A table type cannot be altered, and JobInputList stays for
        // instances of the previous version still running during a rolling upgrade.
        `CREATE TYPE ${s}.[JobInputListV2] AS TABLE (
  [Ord] int NOT NULL PRIMARY KEY,
  [Queue] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL,
  [Payload] nvarchar(max) NOT NULL,
  [Priority] int NOT NULL,
  [RunAt] datetime2(3) NULL,
  [DelayMs] bigint NOT NULL,
  [GroupKey] nvarchar(255) COLLATE Latin1_General_100_BIN2 NULL,
  [IdempotencyKey] nvarchar(255) COLLATE Latin1_General_100_BIN2 NULL,
  [MaxAttempts] int NULL,
  [DefaultMaxAttempts] int NOT NULL
);`,
      ];
    },
  },
  {
    version: 3,
    description: 'indexes for the reaper, the monitoring figures and retention cleanup',
    // Each statement names the query it serves; an index that already exists is re-keyed with
    // DROP_EXISTING ("drop and rebuild the existing clustered or nonclustered index with
    // modified column specifications, and keep the same name",
    // https://learn.microsoft.com/sql/t-sql/statements/create-index-transact-sql). Offline
    // rebuilds: each holds a schema-modification lock on Jobs (or Attempts) while it builds, so
    // on a large table apply this version when the queue is quiet.
    batches: (schema) => {
      const s = quoteMssqlIdentifier(schema);
      return [
        // The reaper takes TOP (@batch) expired leases of every queue in LeaseUntil order: led by
        // LeaseUntil, that is a range seek that stops after @batch rows. Led by Queue (version 1),
        // it read and U-locked every leased row and sorted them on each call. The per-queue lease
        // figures now read the whole leased set, which running handlers bound. Attempts: the
        // repeatedly-failing figure of leased jobs.
        `CREATE NONCLUSTERED INDEX [IX_Jobs_Leased] ON ${s}.[Jobs] ([LeaseUntil], [Queue]) INCLUDE ([Attempts]) WHERE [State] = 'leased' WITH (DROP_EXISTING = ON);`,
        // The claim's order, plus Attempts for the retrying and repeatedly-failing figures, which
        // otherwise cost a lookup per ready job. A row enters or leaves this index on every state
        // change anyway, and only the claim (which moves it out) changes Attempts of a ready row.
        `CREATE NONCLUSTERED INDEX [IX_Jobs_Claim] ON ${s}.[Jobs] ([Queue], [Priority] DESC, [RunAt], [Id]) INCLUDE ([Attempts]) WHERE [State] = 'ready' WITH (DROP_EXISTING = ON);`,
        // listDead pages by Id; purgeDead's olderThanMs reads FinishedAt without a lookup.
        `CREATE NONCLUSTERED INDEX [IX_Jobs_Dead] ON ${s}.[Jobs] ([Queue], [Id]) INCLUDE ([FinishedAt]) WHERE [State] = 'dead' WITH (DROP_EXISTING = ON);`,
        // Dead retention (cleanup, every queue): oldest first, the key window checked in the index.
        `CREATE NONCLUSTERED INDEX [IX_Jobs_DeadFinished] ON ${s}.[Jobs] ([FinishedAt]) INCLUDE ([IdempotencyKey]) WHERE [State] = 'dead';`,
        // Done retention in two ranges: keyless rows go after doneMs, keyed rows only once the key
        // window has passed too. In one index, every cleanup call re-read the keyed rows still
        // inside the window before reaching deletable ones.
        `CREATE NONCLUSTERED INDEX [IX_Jobs_Done] ON ${s}.[Jobs] ([FinishedAt]) WHERE [State] = 'done' AND [IdempotencyKey] IS NULL WITH (DROP_EXISTING = ON);`,
        `CREATE NONCLUSTERED INDEX [IX_Jobs_DoneKeyed] ON ${s}.[Jobs] ([FinishedAt]) WHERE [State] = 'done' AND [IdempotencyKey] IS NOT NULL;`,
        // Recent failures per queue: each queue's window is one range seek, Outcome read in place.
        `CREATE NONCLUSTERED INDEX [IX_Attempts_Recent] ON ${s}.[Attempts] ([Queue], [FinishedAt]) INCLUDE ([Outcome]) WITH (DROP_EXISTING = ON);`,
      ];
    },
  },
  {
    version: 4,
    description: 'delayed jobs wait outside the ready index',
    // Review P2: a job not due yet sat in IX_Jobs_Claim, so every claim read and U-locked the
    // delayed rows of higher priorities before reaching due rows of lower ones. It now waits as
    // 'delayed' (it fits the varchar(8) column; a longer name would mean altering [State], which
    // every filtered index names) in an index of its own, read oldest first by the claim that
    // promotes it; Attempts for the retrying figures. Ready rows not due yet move over in the
    // migration transaction (row locks: lock escalation is off for Jobs). A new CHECK is
    // checked against existing rows (WITH CHECK is the default for one), a scan of the table.
    batches: (schema) => {
      const s = quoteMssqlIdentifier(schema);
      return [
        `ALTER TABLE ${s}.[Jobs] DROP CONSTRAINT [CK_Jobs_State];`,
        `ALTER TABLE ${s}.[Jobs] ADD CONSTRAINT [CK_Jobs_State] CHECK ([State] IN ('ready', 'delayed', 'leased', 'done', 'dead'));`,
        `CREATE NONCLUSTERED INDEX [IX_Jobs_Delayed] ON ${s}.[Jobs] ([Queue], [RunAt], [Id]) INCLUDE ([Attempts]) WHERE [State] = 'delayed';`,
        `UPDATE ${s}.[Jobs] WITH (ROWLOCK) SET [State] = 'delayed' WHERE [State] = 'ready' AND [RunAt] > SYSUTCDATETIME();`,
      ];
    },
  },
  {
    version: 5,
    description: 'ordered groups',
    // Issue 11, design (b): one row per active group holds its lease (HeldToken, the claim token
    // of its leased head or batch) and caches its head, the lowest unfinished job. Claims read
    // and lock group rows only (IX_Groups_Claimable), never other groups' jobs; a grouped job is
    // claimed only as its group's head, so it leaves the ungrouped claim and delayed indexes.
    // RowVersion lets the repair sweep tell a row that changed since it was checked. Groups has
    // no foreign key: READPAST updates "may block when reading foreign keys"
    // (https://learn.microsoft.com/sql/t-sql/queries/hints-transact-sql-table). The filtered
    // indexes are re-keyed with DROP_EXISTING ("To modify the filtered index expression, use
    // CREATE INDEX WITH DROP_EXISTING", Create filtered indexes), offline like version 3.
    // A group whose head was not due when it was set (a delayed job, a retry backing off, a stale
    // head set aside) is Waiting: it sits in IX_Groups_Waiting, read oldest first by the claim
    // that promotes it once due, and not in IX_Groups_Claimable, whose order (priority first)
    // would make every claim, and every check for work, step over all the groups not due yet
    // (review: with many of them, each claim walked them all).
    batches: (schema) => {
      const s = quoteMssqlIdentifier(schema);
      return [
        `CREATE TABLE ${s}.[Groups] (
  [Queue] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL,
  [GroupKey] nvarchar(255) COLLATE Latin1_General_100_BIN2 NOT NULL,
  [HeadId] bigint NULL,
  [HeadReadyAt] datetime2(3) NULL,
  [HeadPriority] int NULL,
  [HeldToken] uniqueidentifier NULL,
  [Blocked] bit NOT NULL CONSTRAINT [DF_Groups_Blocked] DEFAULT (0),
  [Waiting] bit NOT NULL CONSTRAINT [DF_Groups_Waiting] DEFAULT (0),
  [UpdatedAt] datetime2(3) NOT NULL CONSTRAINT [DF_Groups_UpdatedAt] DEFAULT (SYSUTCDATETIME()),
  [RowVersion] rowversion NOT NULL,
  CONSTRAINT [PK_Groups] PRIMARY KEY CLUSTERED ([Queue], [GroupKey])
);`,
        // As Jobs: a table lock is the one lock READPAST cannot skip.
        `ALTER TABLE ${s}.[Groups] SET (LOCK_ESCALATION = DISABLE);`,
        // The claim's order over claimable groups (due ones); the claim names this predicate literally.
        `CREATE NONCLUSTERED INDEX [IX_Groups_Claimable] ON ${s}.[Groups] ([Queue], [HeadPriority] DESC, [HeadReadyAt], [HeadId]) WHERE [HeldToken] IS NULL AND [HeadId] IS NOT NULL AND [Blocked] = 0 AND [Waiting] = 0;`,
        // Groups whose head was not due when set, by run time: the claim's promotion seeks the due ones.
        `CREATE NONCLUSTERED INDEX [IX_Groups_Waiting] ON ${s}.[Groups] ([Queue], [HeadReadyAt], [HeadId]) WHERE [HeldToken] IS NULL AND [HeadId] IS NOT NULL AND [Blocked] = 0 AND [Waiting] = 1;`,
        // stats, queueHealth, listBlockedGroups and retention's check of a dead job.
        `CREATE NONCLUSTERED INDEX [IX_Groups_Blocked] ON ${s}.[Groups] ([Queue], [GroupKey]) INCLUDE ([HeadId]) WHERE [Blocked] = 1;`,
        `ALTER TABLE ${s}.[QueueSettings] ADD [GroupOnDead] varchar(8) NOT NULL CONSTRAINT [DF_QueueSettings_GroupOnDead] DEFAULT ('continue');`,
        `ALTER TABLE ${s}.[QueueSettings] ADD CONSTRAINT [CK_QueueSettings_GroupOnDead] CHECK ([GroupOnDead] IN ('continue', 'block'));`,
        `CREATE NONCLUSTERED INDEX [IX_Jobs_Claim] ON ${s}.[Jobs] ([Queue], [Priority] DESC, [RunAt], [Id]) INCLUDE ([Attempts]) WHERE [State] = 'ready' AND [GroupKey] IS NULL WITH (DROP_EXISTING = ON);`,
        `CREATE NONCLUSTERED INDEX [IX_Jobs_Delayed] ON ${s}.[Jobs] ([Queue], [RunAt], [Id]) INCLUDE ([Attempts]) WHERE [State] = 'delayed' AND [GroupKey] IS NULL WITH (DROP_EXISTING = ON);`,
        // Dead retention keeps the dead job that blocks its group: the check reads these.
        `CREATE NONCLUSTERED INDEX [IX_Jobs_DeadFinished] ON ${s}.[Jobs] ([FinishedAt]) INCLUDE ([IdempotencyKey], [Queue], [GroupKey]) WHERE [State] = 'dead' WITH (DROP_EXISTING = ON);`,
        // Every per-group lookup: a group's head and batch, its lowest unfinished job, the
        // grouped figures of stats and queueHealth, the repair sweep's walk over groups.
        `CREATE NONCLUSTERED INDEX [IX_Jobs_Group] ON ${s}.[Jobs] ([Queue], [GroupKey], [Id]) INCLUDE ([State], [RunAt], [Priority], [Attempts]) WHERE [GroupKey] IS NOT NULL AND [State] IN ('ready', 'delayed', 'leased');`,
        // "Is a job of this group batch still leased?" after each completion, and the batch a
        // reaped job drags along: a seek on the token, whatever the depth of the group.
        `CREATE NONCLUSTERED INDEX [IX_Jobs_GroupHold] ON ${s}.[Jobs] ([ClaimToken]) WHERE [State] = 'leased' AND [GroupKey] IS NOT NULL;`,
        // A row for every group with unfinished jobs (a version before this one ignored group
        // keys): the head is the lowest unfinished job, and the group is held by the token of
        // its lowest leased job, so a job running now keeps its group until it finishes. A head
        // not due yet waits.
        `INSERT INTO ${s}.[Groups] ([Queue], [GroupKey], [HeadId], [HeadReadyAt], [HeadPriority], [Waiting], [HeldToken])
SELECT h.[Queue], h.[GroupKey], h.[Id], h.[RunAt], h.[Priority], CASE WHEN h.[RunAt] > SYSUTCDATETIME() THEN 1 ELSE 0 END,
       (SELECT TOP (1) l.[ClaimToken] FROM ${s}.[Jobs] AS l
        WHERE l.[Queue] = h.[Queue] AND l.[GroupKey] = h.[GroupKey] AND l.[State] = 'leased'
        ORDER BY l.[Id])
FROM (SELECT j.[Queue], j.[GroupKey], j.[Id], j.[RunAt], j.[Priority],
             ROW_NUMBER() OVER (PARTITION BY j.[Queue], j.[GroupKey] ORDER BY j.[Id]) AS [Nth]
      FROM ${s}.[Jobs] AS j
      WHERE j.[GroupKey] IS NOT NULL AND j.[State] IN ('ready', 'delayed', 'leased')) AS h
WHERE h.[Nth] = 1;`,
      ];
    },
  },
  {
    version: 6,
    description: 'service broker transport',
    // Issue 12. The Service Broker queues themselves are created by the broker setup (from the
    // module options), not here: these are the tables of our side of the transport.
    // BrokerAttempts journals each handler run of a received message, committed on another
    // connection before the handler runs, so a run that ends in a full rollback (a crash, a lost
    // connection) is still counted: Attempts - 1 - Failures runs never recorded an outcome, and
    // the reader stops below Service Broker's fifth consecutive rollback (which disables the
    // queue). The row goes with the message (deleted in the reader's transaction).
    // BrokerDead keeps dead messages, and the messages still queued on a conversation that was
    // ended with an error (END CONVERSATION WITH ERROR drops them otherwise).
    // BrokerDialogs holds the sender's long-lived dialog per group key, BrokerOutbox the sends
    // that wait while a key's dialog is being closed.
    batches: (schema) => {
      const s = quoteMssqlIdentifier(schema);
      return [
        `CREATE TABLE ${s}.[BrokerAttempts] (
  [Queue] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL,
  [ConversationHandle] uniqueidentifier NOT NULL,
  [MessageSequenceNumber] bigint NOT NULL,
  [Attempts] int NOT NULL,
  [Failures] int NOT NULL CONSTRAINT [DF_BrokerAttempts_Failures] DEFAULT (0),
  [LastError] nvarchar(max) NULL,
  [RetryAt] datetime2(3) NULL,
  [FirstAttemptAt] datetime2(3) NOT NULL CONSTRAINT [DF_BrokerAttempts_FirstAttemptAt] DEFAULT (SYSUTCDATETIME()),
  [LastAttemptAt] datetime2(3) NOT NULL CONSTRAINT [DF_BrokerAttempts_LastAttemptAt] DEFAULT (SYSUTCDATETIME()),
  [WorkerId] nvarchar(200) NULL,
  CONSTRAINT [PK_BrokerAttempts] PRIMARY KEY CLUSTERED ([ConversationHandle], [MessageSequenceNumber]),
  CONSTRAINT [CK_BrokerAttempts_Counts] CHECK ([Attempts] >= 0 AND [Failures] >= 0)
);`,
        `CREATE TABLE ${s}.[BrokerDead] (
  [Id] bigint IDENTITY(1, 1) NOT NULL,
  [Queue] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL,
  [ConversationHandle] uniqueidentifier NOT NULL,
  [ConversationGroupId] uniqueidentifier NOT NULL,
  [MessageSequenceNumber] bigint NOT NULL,
  [MessageTypeName] nvarchar(256) NOT NULL,
  [MessageBody] varbinary(max) NULL,
  [Attempts] int NOT NULL,
  [Crashes] int NOT NULL,
  [LastError] nvarchar(max) NULL,
  [Reason] varchar(32) NOT NULL,
  [DeadAt] datetime2(3) NOT NULL CONSTRAINT [DF_BrokerDead_DeadAt] DEFAULT (SYSUTCDATETIME()),
  CONSTRAINT [PK_BrokerDead] PRIMARY KEY CLUSTERED ([Id]),
  CONSTRAINT [CK_BrokerDead_Reason] CHECK ([Reason] IN ('max-attempts', 'crashes', 'conversation-ended'))
);`,
        // listDead pages a queue's dead messages by Id.
        `CREATE NONCLUSTERED INDEX [IX_BrokerDead_Queue] ON ${s}.[BrokerDead] ([Queue], [Id]);`,
        `CREATE TABLE ${s}.[BrokerDialogs] (
  [Queue] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL,
  [DialogKey] nvarchar(300) COLLATE Latin1_General_100_BIN2 NOT NULL,
  [ConversationHandle] uniqueidentifier NOT NULL,
  [State] char(1) NOT NULL,
  [Sent] bigint NOT NULL CONSTRAINT [DF_BrokerDialogs_Sent] DEFAULT (0),
  [CreatedAt] datetime2(3) NOT NULL CONSTRAINT [DF_BrokerDialogs_CreatedAt] DEFAULT (SYSUTCDATETIME()),
  CONSTRAINT [PK_BrokerDialogs] PRIMARY KEY CLUSTERED ([Queue], [DialogKey]),
  CONSTRAINT [CK_BrokerDialogs_State] CHECK ([State] IN ('A', 'C'))
);`,
        // The initiator's reader finds a dialog by the handle of an EndDialog or Error it receives.
        `CREATE UNIQUE NONCLUSTERED INDEX [UX_BrokerDialogs_Handle] ON ${s}.[BrokerDialogs] ([ConversationHandle]);`,
        `CREATE TABLE ${s}.[BrokerOutbox] (
  [Id] bigint IDENTITY(1, 1) NOT NULL,
  [Queue] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL,
  [DialogKey] nvarchar(300) COLLATE Latin1_General_100_BIN2 NOT NULL,
  [MessageTypeName] nvarchar(256) NOT NULL,
  [MessageBody] varbinary(max) NULL,
  [CreatedAt] datetime2(3) NOT NULL CONSTRAINT [DF_BrokerOutbox_CreatedAt] DEFAULT (SYSUTCDATETIME()),
  CONSTRAINT [PK_BrokerOutbox] PRIMARY KEY CLUSTERED ([Id])
);`,
        // A key's waiting sends, in send order, when its new dialog opens.
        `CREATE NONCLUSTERED INDEX [IX_BrokerOutbox_Key] ON ${s}.[BrokerOutbox] ([Queue], [DialogKey], [Id]);`,
      ];
    },
  },
  {
    version: 7,
    description: 'recurring jobs',
    // Issue 13. One row per schedule. Id, Queue, Cron and Timezone compare in binary, as in
    // PostgreSQL ('Report' and 'report' are two schedules; a cron or zone that differs only in
    // case counts as a changed timing). NextRunAt is null when the expression has no later tick.
    // The fire statement and the idle poll read IX_Schedules_Due (unpaused rows that have a next
    // tick, in NextRunAt order) and name its filter literally. Two table types carry an upsert's
    // schedules and a fire's advances in one round trip each.
    batches: (schema) => {
      const s = quoteMssqlIdentifier(schema);
      return [
        `CREATE TABLE ${s}.[Schedules] (
  [Id] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL,
  [Queue] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL,
  [Cron] nvarchar(256) COLLATE Latin1_General_100_BIN2 NOT NULL,
  [Timezone] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL,
  [Payload] nvarchar(max) NOT NULL,
  [Options] nvarchar(max) NOT NULL,
  [CatchUp] varchar(4) NOT NULL,
  [Paused] bit NOT NULL CONSTRAINT [DF_Schedules_Paused] DEFAULT (0),
  [Source] varchar(7) NOT NULL,
  [NextRunAt] datetime2(3) NULL,
  [LastRunAt] datetime2(3) NULL,
  [LastTick] datetime2(3) NULL,
  [CreatedAt] datetime2(3) NOT NULL CONSTRAINT [DF_Schedules_CreatedAt] DEFAULT (SYSUTCDATETIME()),
  [UpdatedAt] datetime2(3) NOT NULL CONSTRAINT [DF_Schedules_UpdatedAt] DEFAULT (SYSUTCDATETIME()),
  CONSTRAINT [PK_Schedules] PRIMARY KEY CLUSTERED ([Id]),
  CONSTRAINT [CK_Schedules_CatchUp] CHECK ([CatchUp] IN ('none', 'last', 'all')),
  CONSTRAINT [CK_Schedules_Source] CHECK ([Source] IN ('options', 'api'))
);`,
        // As Jobs: a table lock is the one lock the fire statement's READPAST cannot skip.
        `ALTER TABLE ${s}.[Schedules] SET (LOCK_ESCALATION = DISABLE);`,
        `CREATE NONCLUSTERED INDEX [IX_Schedules_Due] ON ${s}.[Schedules] ([NextRunAt], [Id]) WHERE [Paused] = 0 AND [NextRunAt] IS NOT NULL;`,
        `CREATE TYPE ${s}.[ScheduleUpsertList] AS TABLE (
  [Id] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL PRIMARY KEY,
  [Queue] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL,
  [Cron] nvarchar(256) COLLATE Latin1_General_100_BIN2 NOT NULL,
  [Timezone] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL,
  [Payload] nvarchar(max) NOT NULL,
  [Options] nvarchar(max) NOT NULL,
  [CatchUp] varchar(4) NOT NULL,
  [Source] varchar(7) NOT NULL,
  [NextRunAt] datetime2(3) NULL
);`,
        `CREATE TYPE ${s}.[ScheduleAdvanceList] AS TABLE (
  [Id] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL PRIMARY KEY,
  [NextRunAt] datetime2(3) NULL,
  [LastTick] datetime2(3) NULL,
  [Fired] bit NOT NULL
);`,
      ];
    },
  },
  {
    version: 8,
    description: 'throughput',
    // The dashboard's outcome counts: one row per queue and minute (the database clock), added to
    // by every process's flush and read as a range of the last minutes. Clustered on (Minute,
    // Queue), so the read and the retention delete are ranges of the key, and a flush's upsert
    // seeks its rows. No READPAST reads it, so lock escalation keeps its default (a retention
    // delete takes at most SET_BATCH rows). Its own table type carries a flush's counts, one row
    // per queue, in one round trip.
    batches: (schema) => {
      const s = quoteMssqlIdentifier(schema);
      return [
        `CREATE TABLE ${s}.[Throughput] (
  [Minute] datetime2(3) NOT NULL,
  [Queue] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL,
  [Completed] bigint NOT NULL,
  [Failed] bigint NOT NULL,
  [Dead] bigint NOT NULL,
  CONSTRAINT [PK_Throughput] PRIMARY KEY CLUSTERED ([Minute], [Queue]),
  CONSTRAINT [CK_Throughput_Counts] CHECK ([Completed] >= 0 AND [Failed] >= 0 AND [Dead] >= 0)
);`,
        `CREATE TYPE ${s}.[ThroughputCountList] AS TABLE (
  [Queue] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL PRIMARY KEY,
  [Completed] bigint NOT NULL,
  [Failed] bigint NOT NULL,
  [Dead] bigint NOT NULL
);`,
      ];
    },
  },
  {
    version: 9,
    description: 'trace context',
    // The enqueue's trace context (issue 15): the propagator's carrier as JSON text (printable
    // ASCII, so varchar), read back by the claim so the handler's span joins the producer's
    // trace. Adding a nullable column without a default changes metadata only, no row touched,
    // as long as the longest possible row stays within 8,060 bytes (it does: about 4,000 with
    // the column, the (max) columns counted as their 24-byte pointers). A table type cannot be
    // altered, so JobInputListV3 carries it for the bulk enqueue; JobInputListV2 stays for
    // instances of the previous version still running during a rolling upgrade (their jobs
    // carry no trace context).
    batches: (schema) => {
      const s = quoteMssqlIdentifier(schema);
      return [
        `ALTER TABLE ${s}.[Jobs] ADD [TraceContext] varchar(2048) NULL;`,
        `CREATE TYPE ${s}.[JobInputListV3] AS TABLE (
  [Ord] int NOT NULL PRIMARY KEY,
  [Queue] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL,
  [Payload] nvarchar(max) NOT NULL,
  [Priority] int NOT NULL,
  [RunAt] datetime2(3) NULL,
  [DelayMs] bigint NOT NULL,
  [GroupKey] nvarchar(255) COLLATE Latin1_General_100_BIN2 NULL,
  [IdempotencyKey] nvarchar(255) COLLATE Latin1_General_100_BIN2 NULL,
  [MaxAttempts] int NULL,
  [DefaultMaxAttempts] int NOT NULL,
  [TraceContext] varchar(2048) NULL
);`,
      ];
    },
  },
  {
    version: 10,
    description: 'row locks only on jobs, groups and schedules',
    // Review 2, R2-8. The claim, the delayed-job promotion, the reaper, the group claim and the
    // schedule fire read with READPAST, which "skips row-level locks, but page-level locks aren't
    // skipped" (Table hints, READPAST), and they cannot carry ROWLOCK: it shares the granularity
    // slot with READCOMMITTEDLOCK (see CLAIM_HINTS). Had the optimizer chosen page locks for
    // their range reads, other claimers would wait behind them instead of skipping, and a claim
    // moving a row from IX_Jobs_Claim into IX_Jobs_Leased could deadlock with a reaper moving one
    // back (each holding a page U lock the other needs IX on). With page locks switched off on
    // every index of these tables, row locks are the only ones below the table, whatever the plan
    // (https://learn.microsoft.com/sql/t-sql/statements/alter-index-transact-sql, ALLOW_PAGE_LOCKS).
    // Costs: a lock per row where a page lock would have covered many (our statements take at most
    // a few thousand rows; Jobs never escalates, version 1; Groups and Schedules escalate to a table
    // lock past 5,000, as before), and index maintenance must REBUILD these indexes, as REORGANIZE
    // refuses an index without page locks. Every index a later migration creates on these tables
    // says ALLOW_PAGE_LOCKS = OFF itself (a unit test checks it). SET changes metadata only.
    batches: (schema) => {
      const s = quoteMssqlIdentifier(schema);
      return MSSQL_ROW_LOCKED_TABLES.map((table) => `ALTER INDEX ALL ON ${s}.[${table}] SET (ALLOW_PAGE_LOCKS = OFF);`);
    },
  },
  {
    version: 11,
    description: 'broker messages handled as table-queue jobs',
    // Review 2, R2-4/R2-5: Service Broker receivers now move each message, in the transaction that
    // RECEIVEs it, into the broker queue's table queue, and handlers run it as a job (leases,
    // retries, the dead state). The attempt journal of the old readers, which ran handlers inside
    // their RECEIVE transaction, has nothing left to journal; their dead messages become dead jobs
    // of their queue, in the payload a receiver writes (broker/reader/broker.job.ts: the body in base64), in the
    // ordered group of their conversation group, and the dead table goes. A body over 64 MiB (the
    // ceiling of maxPayloadBytes; only a T-SQL sender could send one) keeps only its size, as a
    // receiver's move does (broker/reader/broker.job.ts BROKER_MOVE_MAX_KEPT_BYTES): its base64 could not be
    // read back into one Node string. The old readers must be stopped first: they use both tables.
    batches: (schema) => {
      const s = quoteMssqlIdentifier(schema);
      return [
        `DROP TABLE ${s}.[BrokerAttempts];`,
        `IF EXISTS (SELECT 1 FROM ${s}.[BrokerDead])
BEGIN
  DECLARE @count bigint = (SELECT COUNT_BIG(*) FROM ${s}.[BrokerDead]);
  DECLARE @range sql_variant;
  EXEC sys.sp_sequence_get_range @sequence_name = N'${s}.[JobIdSequence]', @range_size = @count, @range_first_value = @range OUTPUT;
  DECLARE @firstId bigint = CAST(@range AS bigint);
  INSERT INTO ${s}.[Jobs] WITH (ROWLOCK) ([Id], [Queue], [State], [Payload], [Priority], [RunAt], [GroupKey], [Attempts],
                                      [MaxAttempts], [CreatedAt], [FinishedAt], [LastError])
  SELECT @firstId + ROW_NUMBER() OVER (ORDER BY d.[Id]) - 1, d.[Queue], 'dead',
         (SELECT d.[MessageTypeName] AS [type],
                 CONVERT(nvarchar(36), d.[ConversationHandle]) AS [conversationHandle],
                 CONVERT(nvarchar(36), d.[ConversationGroupId]) AS [conversationGroupId],
                 CONVERT(varchar(20), d.[MessageSequenceNumber]) AS [sequence],
                 CASE WHEN DATALENGTH(d.[MessageBody]) <= ${MIGRATED_BODY_MAX_BYTES} THEN d.[MessageBody] END AS [body],
                 CASE WHEN DATALENGTH(d.[MessageBody]) > ${MIGRATED_BODY_MAX_BYTES} THEN DATALENGTH(d.[MessageBody]) END AS [droppedBytes]
          FOR JSON PATH, WITHOUT_ARRAY_WRAPPER),
         0, d.[DeadAt], CONVERT(nvarchar(36), d.[ConversationGroupId]), d.[Attempts],
         CASE WHEN d.[Attempts] < ${MIGRATED_MAX_ATTEMPTS} THEN ${MIGRATED_MAX_ATTEMPTS} ELSE d.[Attempts] END, d.[DeadAt], d.[DeadAt],
         COALESCE(d.[LastError], CONCAT(N'dead: ', d.[Reason]))
  FROM ${s}.[BrokerDead] AS d;
END;`,
        `DROP TABLE ${s}.[BrokerDead];`,
      ];
    },
  },
  {
    version: 12,
    description: 'queue pauses',
    // One row per paused queue (issue 23). Every claim of a queue first seeks its row (the
    // primary key), so a pause holds on every instance from its commit; a new table, so an
    // instance of the previous release (which never reads it) keeps claiming until upgraded.
    // The claims read it with READPAST: page locks off, as on the other tables claims skip in.
    batches: (schema) => {
      const s = quoteMssqlIdentifier(schema);
      return [
        `CREATE TABLE ${s}.[QueuePauses] (
  [Queue] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL,
  [Reason] nvarchar(1000) NULL,
  [PausedAt] datetime2(3) NOT NULL CONSTRAINT [DF_QueuePauses_PausedAt] DEFAULT (SYSUTCDATETIME()),
  CONSTRAINT [PK_QueuePauses] PRIMARY KEY CLUSTERED ([Queue]) WITH (ALLOW_PAGE_LOCKS = OFF)
);`,
      ];
    },
  },
  {
    version: 13,
    description: 'job cancellation',
    // cancel() (issue 23): a ready or delayed job becomes 'canceled' (final; 8 characters, as
    // [State] holds: the filtered indexes on it keep its type fixed); a leased one gets
    // [CancelRequestedAt], which heartbeats report to its owner. Nullable columns without a
    // default change metadata only; the longest possible row stays within 8,060 bytes (about
    // 6,000 with the new nvarchar(1000)). The state and outcome checks are re-created with the new
    // values, each checked against every row once (as version 4 did); canceled jobs get a
    // retention index of their own. Instances of the previous release never write or read
    // 'canceled': their claims skip canceled jobs, their heartbeats ignore a cancel request (the
    // job then runs to its end there).
    batches: (schema) => {
      const s = quoteMssqlIdentifier(schema);
      return [
        `ALTER TABLE ${s}.[Jobs] ADD [CancelRequestedAt] datetime2(3) NULL, [CancelReason] nvarchar(1000) NULL;`,
        `ALTER TABLE ${s}.[Jobs] DROP CONSTRAINT [CK_Jobs_State];`,
        `ALTER TABLE ${s}.[Jobs] ADD CONSTRAINT [CK_Jobs_State] CHECK ([State] IN ('ready', 'delayed', 'leased', 'done', 'dead', 'canceled'));`,
        `ALTER TABLE ${s}.[Attempts] DROP CONSTRAINT [CK_Attempts_Outcome];`,
        `ALTER TABLE ${s}.[Attempts] ADD CONSTRAINT [CK_Attempts_Outcome] CHECK ([Outcome] IN ('failed', 'lease-expired', 'canceled'));`,
        `CREATE NONCLUSTERED INDEX [IX_Jobs_Canceled] ON ${s}.[Jobs] ([FinishedAt]) INCLUDE ([IdempotencyKey])
  WHERE [State] = 'canceled' WITH (ALLOW_PAGE_LOCKS = OFF);`,
      ];
    },
  },
  {
    version: 14,
    description: 'job results and progress',
    // A handler's return value, written by the completion statement, and its last reported
    // progress, written by heartbeats and the completion (issue 23): nullable nvarchar(max)
    // columns (metadata changes; off-row past 8,000 bytes). A table type cannot be altered, so
    // CompletionList carries each completion's result and progress, and HeartbeatListV2 the
    // progress beside each lease; OwnedJobList and HeartbeatList stay, for the other statements
    // and for instances of the previous release during a rolling upgrade.
    batches: (schema) => {
      const s = quoteMssqlIdentifier(schema);
      return [
        `ALTER TABLE ${s}.[Jobs] ADD [Result] nvarchar(max) NULL, [Progress] nvarchar(max) NULL;`,
        `CREATE TYPE ${s}.[CompletionList] AS TABLE (
  [Id] bigint NOT NULL PRIMARY KEY,
  [Token] uniqueidentifier NOT NULL,
  [Result] nvarchar(max) NULL,
  [Progress] nvarchar(max) NULL
);`,
        `CREATE TYPE ${s}.[HeartbeatListV2] AS TABLE (
  [Id] bigint NOT NULL PRIMARY KEY,
  [Token] uniqueidentifier NOT NULL,
  [LeaseMs] int NOT NULL,
  [MaxMs] int NULL,
  [Progress] nvarchar(max) NULL
);`,
      ];
    },
  },
  {
    version: 15,
    description: 'flow control',
    // Issue 24, as PostgreSQL's version 11. A job's concurrency key; the limits its queue's
    // consumers recorded; FlowState, one row per limited queue (Lane N'': the row every flow
    // claim of the queue locks, by updating it, and its round-robin cursor) and per postponed key
    // (Lane = the key, BlockedUntil); FlowStarts, the starts of each rate window (Lane N'' for the
    // queue's, the key for rateLimitPerKey's), one row per start, seeked by time. Keyed ready jobs
    // leave IX_Jobs_Claim for IX_Jobs_KeyReady, ordered by key, so the flow claim steps from key
    // to key (one seek each) and a key with a million jobs is one key; IX_Jobs_KeyLeased counts a
    // queue's and a key's slots. The nullable columns change metadata only; the longest possible Jobs row grows
    // by 510 bytes (about 6,500, within 8,060). IX_Jobs_Claim is re-keyed offline (as version 5
    // did): a claim of the previous release names no concurrency key, so it cannot use the new
    // index; stop that release's consumers before applying this version (docs/flow-control.md).
    // A table type cannot be altered: JobInputListV4 carries the key; V3 stays for the previous
    // release's producers during a rolling upgrade.
    batches: (schema) => {
      const s = quoteMssqlIdentifier(schema);
      return [
        `ALTER TABLE ${s}.[Jobs] ADD [ConcurrencyKey] nvarchar(255) COLLATE Latin1_General_100_BIN2 NULL;`,
        `ALTER TABLE ${s}.[QueueSettings] ADD [GlobalConcurrency] int NULL, [ConcurrencyPerKey] int NULL, [RateMax] int NULL,
  [RatePerMs] int NULL, [KeyRateMax] int NULL, [KeyRatePerMs] int NULL;`,
        `CREATE TABLE ${s}.[FlowState] (
  [Queue] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL,
  [Lane] nvarchar(255) COLLATE Latin1_General_100_BIN2 NOT NULL,
  [CursorKey] nvarchar(255) COLLATE Latin1_General_100_BIN2 NULL,
  [BlockedUntil] datetime2(3) NULL,
  [UpdatedAt] datetime2(3) NOT NULL CONSTRAINT [DF_FlowState_UpdatedAt] DEFAULT (SYSUTCDATETIME()),
  CONSTRAINT [PK_FlowState] PRIMARY KEY CLUSTERED ([Queue], [Lane]) WITH (ALLOW_PAGE_LOCKS = OFF)
);`,
        `CREATE TABLE ${s}.[FlowStarts] (
  [Queue] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL,
  [Lane] nvarchar(255) COLLATE Latin1_General_100_BIN2 NOT NULL,
  [At] datetime2(3) NOT NULL,
  [Seq] bigint IDENTITY(1, 1) NOT NULL,
  CONSTRAINT [PK_FlowStarts] PRIMARY KEY CLUSTERED ([Queue], [Lane], [At], [Seq]) WITH (ALLOW_PAGE_LOCKS = OFF)
);`,
        // A claim prunes up to a window of starts (rateLimit max: 10,000 rows): row locks, never the table's.
        `ALTER TABLE ${s}.[FlowStarts] SET (LOCK_ESCALATION = DISABLE);`,
        `CREATE NONCLUSTERED INDEX [IX_Jobs_Claim] ON ${s}.[Jobs] ([Queue], [Priority] DESC, [RunAt], [Id]) INCLUDE ([Attempts])
  WHERE [State] = 'ready' AND [GroupKey] IS NULL AND [ConcurrencyKey] IS NULL WITH (DROP_EXISTING = ON, ALLOW_PAGE_LOCKS = OFF);`,
        `CREATE NONCLUSTERED INDEX [IX_Jobs_KeyReady] ON ${s}.[Jobs] ([Queue], [ConcurrencyKey], [Priority] DESC, [RunAt], [Id])
  INCLUDE ([Attempts]) WHERE [State] = 'ready' AND [ConcurrencyKey] IS NOT NULL WITH (ALLOW_PAGE_LOCKS = OFF);`,
        // Every leased job, keyed or not: the flow claim counts a queue's (globalConcurrency) with
        // a seek on Queue, and a key's (concurrencyPerKey) on both columns. IX_Jobs_Leased leads
        // with LeaseUntil, so a count by queue there would read every queue's leases, waiting,
        // under locking READ COMMITTED, on other queues' heartbeats and claims while it holds the
        // queue's flow lock.
        `CREATE NONCLUSTERED INDEX [IX_Jobs_KeyLeased] ON ${s}.[Jobs] ([Queue], [ConcurrencyKey])
  WHERE [State] = 'leased' WITH (ALLOW_PAGE_LOCKS = OFF);`,
        `CREATE TYPE ${s}.[JobInputListV4] AS TABLE (
  [Ord] int NOT NULL PRIMARY KEY,
  [Queue] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL,
  [Payload] nvarchar(max) NOT NULL,
  [Priority] int NOT NULL,
  [RunAt] datetime2(3) NULL,
  [DelayMs] bigint NOT NULL,
  [GroupKey] nvarchar(255) COLLATE Latin1_General_100_BIN2 NULL,
  [IdempotencyKey] nvarchar(255) COLLATE Latin1_General_100_BIN2 NULL,
  [MaxAttempts] int NULL,
  [DefaultMaxAttempts] int NOT NULL,
  [TraceContext] varchar(2048) NULL,
  [ConcurrencyKey] nvarchar(255) COLLATE Latin1_General_100_BIN2 NULL
);`,
      ];
    },
  },
  {
    version: 16,
    description: 'enqueue from T-SQL',
    // Issue 25: [<schema>].[Enqueue], producer.enqueue for triggers, procedures and SQL Agent jobs
    // (queries/enqueue-procedure.queries.ts). Built from the store's grouped enqueue as it is at
    // this release: a test pins this version's text, so a later change to that statement freezes
    // this text here and alters the procedure in a new version. Callable by its owner; others
    // need GRANT EXECUTE (the CLI prints it: --grants-for-enqueuers).
    batches: (schema) => [mssqlEnqueueProcedure(schema)],
  },
  {
    version: 17,
    description: 'scale recommendation',
    // Issue 26: the completed jobs' handler time per minute (BusyMs, the run time the scale
    // recommendation sizes readers by; a NOT NULL column with a default: existing rows read 0),
    // the table type that carries it (a type cannot be altered: V1 stays for the previous
    // release's processes), and [<schema>].[DesiredReaders], what KEDA's mssql scaler queries
    // (queries/scaling.queries.ts). Built from the scale statement as it is at this release and
    // pinned as version 16 is: a later change to it alters the procedure in a new version.
    batches: (schema) => {
      const s = quoteMssqlIdentifier(schema);
      return [
        `ALTER TABLE ${s}.[Throughput] ADD [BusyMs] bigint NOT NULL CONSTRAINT [DF_Throughput_BusyMs] DEFAULT (0);`,
        `CREATE TYPE ${s}.[ThroughputCountListV2] AS TABLE (
  [Queue] nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL PRIMARY KEY,
  [Completed] bigint NOT NULL,
  [Failed] bigint NOT NULL,
  [Dead] bigint NOT NULL,
  [BusyMs] bigint NOT NULL
);`,
        mssqlDesiredReadersProcedure(mssqlTables(schema)),
      ];
    },
  },
];

export const MSSQL_LATEST_VERSION = MSSQL_MIGRATIONS[MSSQL_MIGRATIONS.length - 1]!.version;

/**
 * What a login needs to run the store once the schema is installed (claims, completions, the
 * reaper, retention, enqueues, schedules; not migrations), as GRANT statements for `principal`
 * (a database principal, already validated and bracket-quoted): the tables' data, the job id
 * sequence (sp_sequence_get_range needs UPDATE on it), and the table types every batch of jobs
 * travels in ("to declare a table variable that uses a user-defined table type, EXECUTE
 * permission is required on that user-defined table type", User-Defined Table Types).
 */
export function mssqlRuntimeGrants(schema: string, principal: string): string[] {
  const s = quoteMssqlIdentifier(schema);
  return [
    `GRANT SELECT, INSERT, UPDATE, DELETE ON SCHEMA::${s} TO ${principal};`,
    `GRANT UPDATE ON OBJECT::${s}.[JobIdSequence] TO ${principal};`,
    ...Object.values(MSSQL_TABLE_TYPES).map(
      (type) => `GRANT EXECUTE ON TYPE::${s}.${quoteMssqlIdentifier(type)} TO ${principal};`,
    ),
  ];
}

/** Objects needed before the version can be read; safe to repeat. */
export function mssqlBootstrap(schema: string): string[] {
  const s = quoteMssqlIdentifier(schema);
  return [
    // CREATE SCHEMA must be alone in its batch, hence the dynamic SQL; the name is validated.
    `IF SCHEMA_ID(N'${schema}') IS NULL EXEC (N'CREATE SCHEMA ${s};');`,
    `IF OBJECT_ID(N'${s}.[SchemaVersion]', N'U') IS NULL
CREATE TABLE ${s}.[SchemaVersion] (
  [Version] int NOT NULL CONSTRAINT [PK_SchemaVersion] PRIMARY KEY,
  [Description] nvarchar(400) NOT NULL,
  [AppliedAt] datetime2(3) NOT NULL CONSTRAINT [DF_SchemaVersion_AppliedAt] DEFAULT (SYSUTCDATETIME())
);`,
  ];
}

/**
 * Serializes installs: the lock belongs to the migration transaction, so it is released by
 * COMMIT or ROLLBACK, and by the server if the process dies mid-way.
 */
export function mssqlMigrationLock(): string {
  return `DECLARE @result int;
EXEC @result = sp_getapplock @Resource = @resource, @LockMode = 'Exclusive', @LockOwner = 'Transaction', @LockTimeout = @timeoutMs;
IF @result < 0
  THROW 51000, N'nestjs-sql-queue: could not take the schema migration lock (sp_getapplock)', 1;`;
}

/** sp_getapplock compares resource names in binary; schema names are case-insensitive. */
export function mssqlMigrationLockResource(schema: string): string {
  return `nestjs-sql-queue:migrate:${schema.toLowerCase()}`;
}

export function mssqlReadVersion(schema: string): string {
  const s = quoteMssqlIdentifier(schema);
  return `IF OBJECT_ID(N'${s}.[SchemaVersion]', N'U') IS NULL
  SELECT CAST(0 AS int) AS [Version];
ELSE
  EXEC (N'SELECT ISNULL(MAX([Version]), 0) AS [Version] FROM ${s}.[SchemaVersion];');`;
}

export function mssqlRecordVersion(schema: string): string {
  return `INSERT INTO ${quoteMssqlIdentifier(schema)}.[SchemaVersion] ([Version], [Description]) VALUES (@version, @description);`;
}

/**
 * Drops everything the migrations create in schema @schema (a parameter), then the schema:
 * for uninstalling, and for tests and benchmarks that each work in a schema of their own.
 */
export function mssqlDropSchema(): string {
  // One object per round of the loop, chosen with TOP (1) … ORDER BY: a table that another
  // table's foreign key references goes after that table. (Concatenating into a variable with
  // an ORDER BY is undocumented behaviour, and STRING_AGG needs SQL Server 2017.) XACT_ABORT
  // ends the batch on a failed DROP instead of looping on it.
  return `SET XACT_ABORT ON;
DECLARE @statement nvarchar(max);
WHILE 1 = 1
BEGIN
  SET @statement = NULL;
  -- Procedures first: the Enqueue procedure references a table type of the schema.
  SELECT TOP (1) @statement = N'DROP PROCEDURE ' + QUOTENAME(@schema) + N'.' + QUOTENAME(name) + N';'
  FROM sys.procedures WHERE schema_id = SCHEMA_ID(@schema) ORDER BY name;
  IF @statement IS NULL
    SELECT TOP (1) @statement = N'DROP TABLE ' + QUOTENAME(@schema) + N'.' + QUOTENAME(t.name) + N';'
    FROM sys.tables AS t
    WHERE t.schema_id = SCHEMA_ID(@schema)
    ORDER BY CASE WHEN EXISTS (
      SELECT 1 FROM sys.foreign_keys AS fk WHERE fk.referenced_object_id = t.object_id AND fk.parent_object_id <> t.object_id
    ) THEN 1 ELSE 0 END, t.name;
  IF @statement IS NULL
    SELECT TOP (1) @statement = N'DROP SEQUENCE ' + QUOTENAME(@schema) + N'.' + QUOTENAME(name) + N';'
    FROM sys.sequences WHERE schema_id = SCHEMA_ID(@schema) ORDER BY name;
  IF @statement IS NULL
    SELECT TOP (1) @statement = N'DROP TYPE ' + QUOTENAME(@schema) + N'.' + QUOTENAME(name) + N';'
    FROM sys.types WHERE is_user_defined = 1 AND schema_id = SCHEMA_ID(@schema) ORDER BY name;
  IF @statement IS NULL BREAK;
  EXEC sys.sp_executesql @statement;
END;
IF SCHEMA_ID(@schema) IS NOT NULL
BEGIN
  SET @statement = N'DROP SCHEMA ' + QUOTENAME(@schema) + N';';
  EXEC sys.sp_executesql @statement;
END;`;
}

/**
 * The install/upgrade script a DBA can review and run with sqlcmd or SSMS (GO separates
 * batches). It sets the session options filtered indexes need, and after every batch it
 * checks that the transaction is still open: if a batch failed (XACT_ABORT rolled back), the
 * rest only compiles (NOEXEC), so a half-installed schema can never record its version.
 */
export function mssqlInstallScript(schema: string, fromVersion = 0): string {
  const s = quoteMssqlIdentifier(schema);
  const guard = ['IF @@TRANCOUNT = 0 SET NOEXEC ON;', 'GO'];
  const out = [
    fromVersion >= MSSQL_LATEST_VERSION
      ? `-- nestjs-sql-queue schema for SQL Server, schema ${schema}: already at version ${MSSQL_LATEST_VERSION}, nothing to apply`
      : `-- nestjs-sql-queue schema for SQL Server, versions ${fromVersion + 1}..${MSSQL_LATEST_VERSION}, schema ${schema}`,
    // A batch that fails to compile does not roll back under XACT_ABORT: only stopping at the
    // first error (and so closing the connection) keeps the later batches from running.
    '-- Run with `sqlcmd -I -b -i <this file>` (SSMS: SQLCMD mode with :on error exit).',
    ...[
      'ANSI_NULLS',
      'ANSI_PADDING',
      'ANSI_WARNINGS',
      'ARITHABORT',
      'CONCAT_NULL_YIELDS_NULL',
      'QUOTED_IDENTIFIER',
    ].map((option) => `SET ${option} ON;`),
    'SET NUMERIC_ROUNDABORT OFF;',
    'SET XACT_ABORT ON;',
    'BEGIN TRANSACTION;',
    'GO',
    `DECLARE @resource nvarchar(255) = N'${mssqlMigrationLockResource(schema)}', @timeoutMs int = 60000;`,
    mssqlMigrationLock(),
    'GO',
    ...guard,
  ];
  for (const batch of mssqlBootstrap(schema)) out.push(batch, 'GO', ...guard);
  for (const migration of MSSQL_MIGRATIONS.filter((m) => m.version > fromVersion)) {
    out.push(`-- ${migration.version}: ${migration.description}`);
    for (const batch of migration.batches(schema)) out.push(batch, 'GO', ...guard);
    out.push(
      `INSERT INTO ${s}.[SchemaVersion] ([Version], [Description]) VALUES (${migration.version}, N'${migration.description.replace(/'/g, "''")}');`,
      'GO',
      ...guard,
    );
  }
  out.push('COMMIT TRANSACTION;', 'GO', 'SET NOEXEC OFF;', 'GO');
  return `${out.join('\n')}\n`;
}

/**
 * What a principal needs to call [<schema>].[Enqueue] and nothing else: EXECUTE on the procedure,
 * which runs AS OWNER (no table, sequence or type rights). Safe to run again.
 */
export function mssqlEnqueueGrantsScript(schema: string, principal: string): string {
  const grantee = quoteMssqlIdentifier(assertPrincipalName('enqueuers', principal));
  return `-- Lets ${grantee} call ${mssqlEnqueueProcedureName(schema)} and nothing else (no table rights).
GRANT EXECUTE ON OBJECT::${mssqlEnqueueProcedureName(schema)} TO ${grantee};
GO
`;
}

/**
 * What an autoscaler's login needs to run [<schema>].[DesiredReaders] and nothing else: EXECUTE on
 * the procedure, which runs as its owner. Safe to run again.
 */
export function mssqlScalerGrantsScript(schema: string, principal: string): string {
  const grantee = quoteMssqlIdentifier(assertPrincipalName('scalers', principal));
  return `-- Lets ${grantee} run ${mssqlDesiredReadersName(schema)} and nothing else (KEDA's mssql scaler).
GRANT EXECUTE ON OBJECT::${mssqlDesiredReadersName(schema)} TO ${grantee};
GO
`;
}
