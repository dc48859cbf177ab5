/**
 * The sample app's own tables and statements, one set per dialect: a business table written
 * in the same transaction as an enqueue (signups), and the idempotent receiver a handler
 * "sends" through (sent_emails, unique on the job's idempotency key).
 */
export interface SampleStatements {
  /** (lock name) → serializes the setup of replicas booting at once; held until the transaction ends. */
  setupLock: string;
  /** Idempotent DDL, run once at boot under the lock. */
  setup: string[];
  /** (email, name) → one row { id } */
  insertSignup: string;
  /** (idempotency key, recipient, subject, job id, attempt) → one row { inserted } (1 or 0) */
  recordSent: string;
  /** (limit) → the most recent sent emails */
  listSent: string;
}

/** The statements for PostgreSQL and PGlite; `schema` is checked by the configuration. */
export function postgresStatements(schema: string): SampleStatements {
  const s = `"${schema}"`;
  return {
    setupLock: 'SELECT pg_advisory_xact_lock(hashtext($1))',
    setup: [
      `CREATE SCHEMA IF NOT EXISTS ${s}`,
      `CREATE TABLE IF NOT EXISTS ${s}.signups (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  email varchar(320) NOT NULL UNIQUE,
  name varchar(200) NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now()
)`,
      `CREATE TABLE IF NOT EXISTS ${s}.sent_emails (
  idempotency_key varchar(255) PRIMARY KEY,
  recipient varchar(320) NOT NULL,
  subject varchar(200) NOT NULL,
  job_id bigint NOT NULL,
  attempt integer NOT NULL,
  sent_at timestamptz NOT NULL DEFAULT now()
)`,
    ],
    insertSignup: `INSERT INTO ${s}.signups (email, name) VALUES ($1, $2) RETURNING id::text AS id`,
    // The receiver's whole point: a second delivery of the same key changes nothing.
    recordSent: `WITH inserted AS (
  INSERT INTO ${s}.sent_emails (idempotency_key, recipient, subject, job_id, attempt)
  VALUES ($1, $2, $3, $4, $5)
  ON CONFLICT (idempotency_key) DO NOTHING
  RETURNING 1
)
SELECT count(*)::int AS inserted FROM inserted`,
    listSent: `SELECT idempotency_key AS "idempotencyKey", recipient, subject, job_id::text AS "jobId", attempt, sent_at AS "sentAt"
FROM ${s}.sent_emails ORDER BY sent_at DESC LIMIT $1`,
  };
}

/** The statements for SQL Server; `schema` is checked by the configuration. */
export function mssqlStatements(schema: string): SampleStatements {
  const s = `[${schema}]`;
  return {
    setupLock: `DECLARE @result int;
EXEC @result = sp_getapplock @Resource = @p1, @LockMode = 'Exclusive', @LockOwner = 'Transaction', @LockTimeout = 60000;
IF @result < 0
  THROW 51000, N'could not take the sample app setup lock', 1;`,
    setup: [
      `IF SCHEMA_ID(N'${schema}') IS NULL EXEC (N'CREATE SCHEMA ${s};');`,
      `IF OBJECT_ID(N'${s}.[Signups]', N'U') IS NULL
CREATE TABLE ${s}.[Signups] (
  [Id] bigint IDENTITY(1, 1) NOT NULL CONSTRAINT [PK_Signups] PRIMARY KEY,
  [Email] nvarchar(320) NOT NULL CONSTRAINT [UX_Signups_Email] UNIQUE,
  [Name] nvarchar(200) NOT NULL,
  [CreatedAt] datetime2(3) NOT NULL CONSTRAINT [DF_Signups_CreatedAt] DEFAULT (SYSUTCDATETIME())
);`,
      `IF OBJECT_ID(N'${s}.[SentEmails]', N'U') IS NULL
CREATE TABLE ${s}.[SentEmails] (
  [IdempotencyKey] nvarchar(255) COLLATE Latin1_General_100_BIN2 NOT NULL CONSTRAINT [PK_SentEmails] PRIMARY KEY,
  [Recipient] nvarchar(320) NOT NULL,
  [Subject] nvarchar(200) NOT NULL,
  [JobId] bigint NOT NULL,
  [Attempt] int NOT NULL,
  [SentAt] datetime2(3) NOT NULL CONSTRAINT [DF_SentEmails_SentAt] DEFAULT (SYSUTCDATETIME())
);`,
    ],
    insertSignup: `INSERT INTO ${s}.[Signups] ([Email], [Name]) OUTPUT CAST(inserted.[Id] AS varchar(20)) AS [id] VALUES (@p1, @p2);`,
    // UPDLOCK + HOLDLOCK lock the key's range, so two deliveries racing on one key serialize
    // and the second one inserts nothing (instead of failing on the primary key).
    recordSent: `INSERT INTO ${s}.[SentEmails] ([IdempotencyKey], [Recipient], [Subject], [JobId], [Attempt])
SELECT @p1, @p2, @p3, @p4, @p5
WHERE NOT EXISTS (SELECT 1 FROM ${s}.[SentEmails] WITH (UPDLOCK, HOLDLOCK) WHERE [IdempotencyKey] = @p1);
SELECT @@ROWCOUNT AS [inserted];`,
    listSent: `SELECT TOP (@p1) [IdempotencyKey] AS [idempotencyKey], [Recipient] AS [recipient], [Subject] AS [subject],
  CAST([JobId] AS varchar(20)) AS [jobId], [Attempt] AS [attempt], [SentAt] AS [sentAt]
FROM ${s}.[SentEmails] ORDER BY [SentAt] DESC;`,
  };
}
