// Enqueue from T-SQL: the procedure migrations install ([<schema>].[Enqueue]), which validates as
// prepareJob does, with the same messages, and runs the store's own grouped enqueue.
import { MAX_DELAY_MS, SCHEDULE_KEY_PREFIX } from '../../../core/producer/index.js';
import {
  DEFAULT_MAX_ATTEMPTS,
  DEFAULT_MAX_PAYLOAD_BYTES,
  KEY_MAX_LENGTH,
  MAX_ATTEMPTS_LIMIT,
  WHITESPACE_CODE_POINTS,
} from '../../../core/validation.js';
import { quoteMssqlIdentifier } from '../mssql.identifiers.js';
import { mssqlEnqueueProcedureBody } from './enqueue.queries.js';
import { SESSION_SETTINGS } from './session.js';

/** THROW number of the Enqueue procedure's refusals (a bad argument; the message says which). */
export const MSSQL_ENQUEUE_REFUSED = 51010;

/** Comparisons by UTF-16 code unit, whatever the database's collation (an SC collation counts code points). */
const BIN = 'COLLATE Latin1_General_100_BIN2';

/** A string literal: ASCII only, so a script read by sqlcmd in any code page says the same. */
function literal(text: string): string {
  if (!/^[\x20-\x7e]*$/.test(text)) throw new Error(`not an ASCII literal: ${text}`);
  return `N'${text.replace(/'/g, "''")}'`;
}

/** describe() of core/validation.ts: 'text' (cut after 60 UTF-16 code units, with …), or null. */
function describeText(parameter: string): string {
  return `CASE WHEN ${parameter} IS NULL THEN N'null' ELSE N'''' + CASE WHEN DATALENGTH(${parameter}) / 2 > 60 THEN LEFT(${parameter} ${BIN}, 60) + NCHAR(8230) ELSE ${parameter} END + N'''' END`;
}

/**
 * THROW takes a literal or a variable, so the message is built in @message first; "% is a reserved
 * character in the message text of a THROW statement and must be escaped" by doubling it
 * (https://learn.microsoft.com/sql/t-sql/language-elements/throw-transact-sql): a key's % would
 * otherwise not reach the caller as written.
 */
function refuse(indent: string, message: string): string {
  return `${indent}BEGIN
${indent}  SET @message = REPLACE(${message}, N'%', N'%%');
${indent}  THROW ${MSSQL_ENQUEUE_REFUSED}, @message, 1;
${indent}END;`;
}

// UTF-16 surrogates built from their bytes (little-endian), so no collation or NCHAR range decides them.
const HIGH = 'CONVERT(nchar(1), 0x00D8)';
const HIGH_LAST = 'CONVERT(nchar(1), 0xFFDB)';
const LOW = 'CONVERT(nchar(1), 0x00DC)';
const LOW_LAST = 'CONVERT(nchar(1), 0xFFDF)';

/** True when the text holds U+0000 or a surrogate code unit without its pair. */
function unstorable(text: string): string {
  return `(CHARINDEX(NCHAR(0) ${BIN}, ${text} ${BIN}) > 0
      OR PATINDEX(N'%[' + ${HIGH} + N'-' + ${HIGH_LAST} + N'][^' + ${LOW} + N'-' + ${LOW_LAST} + N']%' ${BIN}, ${text} + N'.') > 0
      OR PATINDEX(N'%[^' + ${HIGH} + N'-' + ${HIGH_LAST} + N'][' + ${LOW} + N'-' + ${LOW_LAST} + N']%' ${BIN}, N'.' + ${text}) > 0)`;
}

/** The key checks of assertKeyText (core/validation.ts), in its order. */
function keyChecks(parameter: string, name: string): string {
  return `IF ${parameter} IS NOT NULL
BEGIN
  IF DATALENGTH(${parameter}) = 0 OR DATALENGTH(${parameter}) / 2 > ${KEY_MAX_LENGTH}
${refuse('  ', `@at + ${literal(`: ${name} must be a non-empty string of at most ${KEY_MAX_LENGTH} characters, got `)} + ${describeText(parameter)}`)}
  IF ${unstorable(parameter)}
${refuse('  ', `@at + ${literal(`: ${name} contains U+0000 or an unpaired surrogate, which cannot be stored as text`)}`)}
  IF UNICODE(RIGHT(${parameter} ${BIN}, 1)) IN (${WHITESPACE_CODE_POINTS.join(', ')})
${refuse('  ', `@at + ${literal(`: ${name} must not end with whitespace, got `)} + ${describeText(parameter)}`)}
END;
`;
}

/**
 * The session options DML on a table with filtered indexes requires (Jobs has several), for a
 * caller whose session lacks them: a trigger fired by an old client, a script with ARITHABORT OFF.
 * ANSI_NULLS and QUOTED_IDENTIFIER are the procedure's own, fixed when it was created (the migration
 * runs with both on); these come from the caller's session, and a SET in a procedure reverts when it
 * returns ("Filtered indexes", SET options requirements; "SET statements"). Set only when off (bits
 * of @@OPTIONS), since changing one recompiles the statements after it.
 */
const FILTERED_INDEX_OPTIONS = `IF (@@OPTIONS & 8) = 0 SET ANSI_WARNINGS ON;
IF (@@OPTIONS & 16) = 0 SET ANSI_PADDING ON;
IF (@@OPTIONS & 64) = 0 SET ARITHABORT ON;
IF (@@OPTIONS & 4096) = 0 SET CONCAT_NULL_YIELDS_NULL ON;
IF (@@OPTIONS & 8192) <> 0 SET NUMERIC_ROUNDABORT OFF;
`;

/** The procedure's signature, as its GRANT names it. */
export function mssqlEnqueueProcedureName(schema: string): string {
  return `${quoteMssqlIdentifier(schema)}.[Enqueue]`;
}

/**
 * `[<schema>].[Enqueue]`: producer.enqueue for triggers, procedures and SQL Agent jobs, in the
 * caller's transaction when there is one (a trigger's, an explicit one), else in one of its own.
 * Returns the job's id and whether this call created it in OUTPUT parameters (a trigger may not
 * return result sets). The checks run in prepareJob's order with its messages (a test holds them
 * equal), as THROW 51010; then the store's grouped enqueue on a one-row JobInputListV4, so keys,
 * ordered groups, delays and the queue's recorded maxAttempts behave as for producer.enqueue.
 *
 * Beyond the producer's checks, the payload is JSON text: NULL stores JSON null; otherwise it must
 * be an object or an array (ISJSON without a type constraint, SQL Server 2016+). Its size is
 * measured in UTF-8 bytes, as the producer measures it: exactly when it is ASCII or on SQL Server
 * 2019+ (a UTF-8 collation, in dynamic SQL so older servers compile the procedure), else as 3 bytes
 * a character once over a third of the limit. The limit is the default maxPayloadBytes; maxAttempts
 * defaults to the queue's recorded setting, else the library's default. No trace context.
 *
 * WITH EXECUTE AS OWNER: the statements run as the schema's owner, so a caller needs EXECUTE on
 * the procedure only, whatever sys.sp_sequence_get_range and sp_getapplock check for themselves.
 * Consumers find the job by polling (within maxPollMs); the doorbell is rung by Node producers
 * only, since ringing takes the sender's dialog pool.
 */
export function mssqlEnqueueProcedure(schema: string): string {
  const s = quoteMssqlIdentifier(schema);
  return `CREATE PROCEDURE ${mssqlEnqueueProcedureName(schema)}
  @Queue nvarchar(4000),
  @Payload nvarchar(max),
  @IdempotencyKey nvarchar(4000) = NULL,
  @GroupKey nvarchar(4000) = NULL,
  @DelayMs bigint = NULL,
  @Priority int = NULL,
  @MaxAttempts int = NULL,
  @RunAt datetimeoffset(3) = NULL,
  @ConcurrencyKey nvarchar(4000) = NULL,
  @JobId bigint = NULL OUTPUT,
  @Created bit = NULL OUTPUT
WITH EXECUTE AS OWNER
AS
BEGIN
-- IMPLICIT_TRANSACTIONS ON without a transaction yet (an ODBC or JDBC connection with autocommit
-- off): the caller means this call to be in the transaction its first statement opens, but turning
-- the option off below would make it commit on its own. Refused before anything runs.
IF (@@OPTIONS & 2) <> 0 AND @@TRANCOUNT = 0
  THROW ${MSSQL_ENQUEUE_REFUSED}, N'nestjs-sql-queue: Enqueue was called with IMPLICIT_TRANSACTIONS ON and no transaction open: BEGIN TRANSACTION first (the job then commits with it), or turn IMPLICIT_TRANSACTIONS off', 1;
${SESSION_SETTINGS}${FILTERED_INDEX_OPTIONS}DECLARE @message nvarchar(2048), @at nvarchar(200), @units bigint, @bytes bigint, @escapes nvarchar(max),
  @escapeAt bigint, @escapeHex nvarchar(4), @unpaired bit = 0;
IF @Queue IS NULL OR DATALENGTH(@Queue) = 0 OR DATALENGTH(@Queue) / 2 > 128 OR @Queue ${BIN} LIKE N'%[^A-Za-z0-9._-]%'
${refuse('', `N'queue name ' + ${describeText('@Queue')} + ${literal(` is invalid: use letters, digits, '.', '-', '_' (1 to 128 characters)`)}`)}
SET @at = N'enqueue to ''' + @Queue + N'''';
IF @Payload IS NULL OR LTRIM(RTRIM(@Payload)) = N'null'
  SET @Payload = N'null';
ELSE IF ISJSON(@Payload) <> 1
${refuse('', `@at + N': payload must be the JSON text of an object or an array (ISJSON), got ' + ${describeText('@Payload')}`)}
SET @units = DATALENGTH(@Payload) / 2;
SET @bytes = @units;
IF @units * 3 > ${DEFAULT_MAX_PAYLOAD_BYTES} AND PATINDEX(N'%[^' + NCHAR(1) + N'-' + NCHAR(127) + N']%' ${BIN}, @Payload) > 0
BEGIN
  -- UTF-8 collations: SQL Server 2019 (15) on, and Azure SQL Database and Managed Instance (engine
  -- editions 5 and 8), which report an older ProductMajorVersion (12), as migration 1 tells them.
  IF CAST(SERVERPROPERTY('ProductMajorVersion') AS int) >= 15 OR CAST(SERVERPROPERTY('EngineEdition') AS int) IN (5, 8)
    EXEC sys.sp_executesql N'SET @b = DATALENGTH(CONVERT(varchar(max), @p COLLATE Latin1_General_100_CI_AS_SC_UTF8));',
      N'@p nvarchar(max), @b bigint OUTPUT', @p = @Payload, @b = @bytes OUTPUT;
  ELSE
    SET @bytes = @units * 3;
END;
IF @bytes > ${DEFAULT_MAX_PAYLOAD_BYTES}
${refuse('', `@at + N': payload is ' + CAST(@bytes AS nvarchar(20)) + ${literal(` bytes of JSON, over the limit of ${DEFAULT_MAX_PAYLOAD_BYTES} (store large documents elsewhere and enqueue a reference)`)}`)}
-- Escapes PostgreSQL's jsonb refuses: \\u0000, and a surrogate's escape without its pair (a pair,
-- as Python's json.dumps writes one, is a character). An escaped backslash (\\\\) is set aside
-- first, so "\\\\u0000" is text, not an escape. Walked escape by escape (CHARINDEX from a start):
-- one pass, and only over payloads that hold a \\u at all.
SET @escapes = REPLACE(@Payload ${BIN}, N'\\\\', NCHAR(1));
SET @escapeAt = CHARINDEX(N'\\u' ${BIN}, @escapes);
WHILE @escapeAt > 0 AND @unpaired = 0
BEGIN
  SET @escapeHex = SUBSTRING(@escapes, @escapeAt + 2, 4);
  IF @escapeHex = N'0000' OR @escapeHex ${BIN} LIKE N'[dD][c-fC-F]__'
    SET @unpaired = 1;
  ELSE IF @escapeHex ${BIN} LIKE N'[dD][89abAB]__'
  BEGIN
    IF SUBSTRING(@escapes, @escapeAt + 6, 6) ${BIN} LIKE N'\\u[dD][c-fC-F]__'
      SET @escapeAt = @escapeAt + 6;
    ELSE
      SET @unpaired = 1;
  END;
  SET @escapeAt = CHARINDEX(N'\\u' ${BIN}, @escapes, @escapeAt + 2);
END;
IF @unpaired = 1 OR ${unstorable('@Payload')}
${refuse('', `@at + ${literal(`: payload contains U+0000 or an unpaired surrogate, which PostgreSQL's jsonb cannot store`)}`)}
IF @RunAt IS NOT NULL AND @DelayMs IS NOT NULL
${refuse('', `@at + N': give runAt or delayMs, not both'`)}
IF @DelayMs < 0 OR @DelayMs > ${MAX_DELAY_MS}
${refuse('', `@at + ${literal(`: delayMs must be an integer from 0 to ${MAX_DELAY_MS}, got `)} + CAST(@DelayMs AS nvarchar(20))`)}
IF @Priority < -32768 OR @Priority > 32767
${refuse('', `@at + N': priority must be an integer from -32768 to 32767, got ' + CAST(@Priority AS nvarchar(20))`)}
IF @MaxAttempts < 1 OR @MaxAttempts > ${MAX_ATTEMPTS_LIMIT}
${refuse('', `@at + ${literal(`: maxAttempts must be an integer from 1 to ${MAX_ATTEMPTS_LIMIT}, got `)} + CAST(@MaxAttempts AS nvarchar(20))`)}
${keyChecks('@GroupKey', 'groupKey')}${keyChecks('@ConcurrencyKey', 'concurrencyKey')}IF @GroupKey IS NOT NULL AND @ConcurrencyKey IS NOT NULL
${refuse('', `@at + N': give groupKey or concurrencyKey, not both (an ordered group already runs one job at a time)'`)}
${keyChecks('@IdempotencyKey', 'idempotencyKey')}IF LEFT(@IdempotencyKey ${BIN}, ${SCHEDULE_KEY_PREFIX.length}) = ${literal(SCHEDULE_KEY_PREFIX)}
${refuse('', `@at + N': idempotencyKey ''' + @IdempotencyKey + ${literal(`' starts with '${SCHEDULE_KEY_PREFIX}', which is reserved for the jobs of recurring schedules: choose another key`)}`)}

DECLARE @inTransaction bit = CASE WHEN @@TRANCOUNT > 0 THEN 1 ELSE 0 END;
DECLARE @jobs ${s}.[JobInputListV4];
INSERT INTO @jobs ([Ord], [Queue], [Payload], [Priority], [RunAt], [DelayMs], [GroupKey], [IdempotencyKey], [MaxAttempts],
                   [DefaultMaxAttempts], [TraceContext], [ConcurrencyKey])
VALUES (0, @Queue, @Payload, ISNULL(@Priority, 0), CAST(SWITCHOFFSET(@RunAt, 0) AS datetime2(3)), ISNULL(@DelayMs, 0),
        @GroupKey, @IdempotencyKey, @MaxAttempts, ${DEFAULT_MAX_ATTEMPTS}, NULL, @ConcurrencyKey);
${mssqlEnqueueProcedureBody(schema)}
END;`;
}
