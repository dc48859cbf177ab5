import { assertInteger } from '../../core/validation.js';
import { quoteMssqlIdentifier } from '../../store/mssql/mssql.identifiers.js';
import {
  MSSQL_AUTOCOMMIT_SESSION,
  MSSQL_TABLE_TYPES,
  mssqlEnqueueInTransaction,
} from '../../store/mssql/mssql.queries.js';
import { BROKER_JOB_FIELDS, BROKER_MOVE_MAX_KEPT_BYTES } from './broker.job.js';
import { BROKER_SYSTEM, brokerStringLiteral, quoteBrokerObject } from '../broker.names.js';
import { MSSQL_END_STATE_ERROR, MSSQL_HANDLE_NOT_FOUND } from '../sender/index.js';
import type { BrokerObjectName, ResolvedBrokerQueue } from '../broker.types.js';

// The receiver's statements (broker.receiver.ts), one function each, SQL text only. Names are
// validated and bracket-quoted; every value is a bound parameter or a validated integer. A
// Service Broker statement that is not first in its batch follows a statement ended by ';'.
//
// A receiver never holds a Service Broker transaction across a round trip: it waits for work
// in autocommit (waitForMessages), and each move (moveMessages) is one batch that begins,
// receives, enqueues and commits on the server, so neither a handler nor a client that dies
// between two requests keeps a received message in an open transaction (review 2, R2-4).

/** The savepoint a move gives its messages back to when its own work fails (at most 32 characters). */
export const BROKER_MOVE_SAVEPOINT = 'sq_move';

/**
 * The longest a move waits for any one lock (SET LOCK_TIMEOUT, ms): a lock it cannot get fails the
 * move with 1222 on the server, which gives the messages back and commits. A move that waits for
 * several locks in turn can still outlast the connection's request timeout; the client then cuts
 * the batch off with its transaction open, and the receiver closes that connection (the server
 * rolls the transaction back with it), as after any failure.
 */
export const BROKER_MOVE_LOCK_TIMEOUT_MS = 5_000;

/** RECEIVEs one move runs at most, each taking one conversation group's messages. */
export const BROKER_MOVE_ROUNDS = 100;

/**
 * Waits up to @timeoutMs (int) for a conversation group with messages, in autocommit: the group
 * lock GET CONVERSATION GROUP takes ends with the statement, so this only tells that work is
 * there. A session waiting here (a GET without WHERE) is what Service Broker's queue monitor
 * counts as a reader that keeps up (seed 003). One row: [Ready] 1 or 0 (timed out). The
 * DECLARE sends nothing, so nothing reaches the driver before the WAITFOR returns.
 */
export function waitForMessages(queue: BrokerObjectName): string {
  return `${MSSQL_AUTOCOMMIT_SESSION}DECLARE @group uniqueidentifier;
WAITFOR (GET CONVERSATION GROUP @group FROM ${quoteBrokerObject(queue)}), TIMEOUT @timeoutMs;
SELECT CASE WHEN @group IS NULL THEN 0 ELSE 1 END AS [Ready];`;
}

/** The columns a move RECEIVEs, in @received's order. */
const RECEIVED_COLUMNS =
  'conversation_group_id, conversation_handle, message_sequence_number, message_type_name, message_body';

/** Received system messages that end our side of their conversation in the move itself. */
const ENDING_TYPES = [BROKER_SYSTEM.END_DIALOG, BROKER_SYSTEM.ERROR].map(brokerStringLiteral).join(', ');

/**
 * `format` 'json': a body of UTF-16LE text (what send() writes: even length, a non-zero first
 * byte followed by 0, no BOM, the rule decodeBrokerText applies) is moved as that text;
 * any other body as its bytes, in base64.
 */
function movedText(format: ResolvedBrokerQueue['format']): string {
  if (format !== 'json') return 'CAST(NULL AS nvarchar(max))';
  return `CASE WHEN DATALENGTH(r.message_body) > 0 AND DATALENGTH(r.message_body) % 2 = 0
        AND SUBSTRING(r.message_body, 1, 1) <> 0x00 AND SUBSTRING(r.message_body, 2, 1) = 0x00
      THEN CAST(r.message_body AS nvarchar(max)) END`;
}

/** The table variable a move RECEIVEs into (the server facts declare theirs from it too). */
export const RECEIVED_TABLE = `DECLARE @received TABLE (
  conversation_group_id uniqueidentifier NOT NULL,
  conversation_handle uniqueidentifier NOT NULL,
  message_sequence_number bigint NOT NULL,
  message_type_name nvarchar(256) NOT NULL,
  message_body varbinary(max) NULL
);
`;

/**
 * One move: in one transaction, RECEIVEs up to `messagesPerTransaction` messages (each RECEIVE
 * takes what is left of that, from one conversation group: the next one that can be locked, or
 * one this transaction holds that got more messages; at most BROKER_MOVE_ROUNDS RECEIVEs; TOP
 * takes an expression, as Microsoft's own parser, ScriptDom's ReceiveStatement.Top, says), enqueues each message
 * that is not EndDialog, Error or DialogTimer as a job of table queue @queue in the ordered group
 * of its conversation group (in conversation and sequence order, so the group runs them in the
 * order they were sent), ends our side of the conversations that were ended (EndDialog, Error),
 * and commits. Params: @queue nvarchar (the broker queue's name, its table queue's too),
 * @maxAttempts int (the default of the queue's jobs when its consumers recorded none). A body
 * over `maxBodyBytes` (the module's maxPayloadBytes, the limit senders obey) is moved without its
 * bytes (`droppedBytes`), so its job dies with an error that says so.
 *
 * Exactly once: the RECEIVE and the INSERT commit together, or neither. A failure of its own
 * (a lock not granted, a refused key lock) rolls back to the savepoint before the RECEIVE and
 * commits what is left (nothing): the messages are back in the queue and no rollback of a
 * RECEIVE is counted towards Service Broker's poison-message disable; only a transaction the
 * server doomed is rolled back whole. The error is thrown on, after that.
 *
 * Session: autocommit guard; READ COMMITTED (the enqueue's locking reads need it); XACT_ABORT
 * off (else every error dooms the transaction); DEADLOCK_PRIORITY HIGH (a move rolled back by
 * the server counts towards the poison disable, a claim or completion chosen instead runs again
 * at once; movers of different conversation groups touch different rows and locks);
 * LOCK_TIMEOUT BROKER_MOVE_LOCK_TIMEOUT_MS. Every SET reverts when the sp_executesql batch ends.
 *
 * Answers one row: [Received] messages, [Moved] jobs enqueued, [Ended] conversations ended,
 * [Errors] (JSON: conversationHandle and base64 body of each Error message, for the log).
 */
export function moveMessages(schema: string, queue: ResolvedBrokerQueue, maxBodyBytes: number): string {
  const top = assertInteger('messagesPerTransaction', queue.messagesPerTransaction, 1, 1_000);
  const keep = assertInteger('maxPayloadBytes', maxBodyBytes, 1, BROKER_MOVE_MAX_KEPT_BYTES);
  const f = BROKER_JOB_FIELDS;
  return `${MSSQL_AUTOCOMMIT_SESSION}SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
SET XACT_ABORT OFF;
SET DEADLOCK_PRIORITY HIGH;
SET LOCK_TIMEOUT ${BROKER_MOVE_LOCK_TIMEOUT_MS};
${RECEIVED_TABLE}DECLARE @jobs ${quoteMssqlIdentifier(schema)}.${quoteMssqlIdentifier(MSSQL_TABLE_TYPES.jobInput)};
DECLARE @inTransaction bit = 1;
DECLARE @moveRound int = 0, @moveCount int = 0, @moveBefore int = 0, @moveLeft int, @moveEnded int = 0;
DECLARE @endHandle uniqueidentifier = NULL, @nextHandle uniqueidentifier, @endError int;
BEGIN TRANSACTION;
SAVE TRANSACTION ${BROKER_MOVE_SAVEPOINT};
BEGIN TRY
  WHILE @moveRound < ${BROKER_MOVE_ROUNDS} AND @moveCount < ${top}
  BEGIN
    SET @moveLeft = ${top} - @moveCount;
    RECEIVE TOP (@moveLeft) ${RECEIVED_COLUMNS} FROM ${quoteBrokerObject(queue.queue)} INTO @received;
    SET @moveRound = @moveRound + 1;
    SET @moveCount = (SELECT COUNT(*) FROM @received);
    IF @moveCount = @moveBefore BREAK;
    SET @moveBefore = @moveCount;
  END;
  -- Our side of each conversation that was ended (EndDialog, Error) ends here. END CONVERSATION
  -- "removes all messages for the conversation from the service queue", and an Error the broker
  -- raised itself need not come last, so the rest of the conversation is received first: it is
  -- moved with the others, none is deleted unread.
  WHILE 1 = 1
  BEGIN
    SET @nextHandle = NULL;
    SELECT TOP (1) @nextHandle = conversation_handle FROM @received
    WHERE message_type_name IN (${ENDING_TYPES}) AND (@endHandle IS NULL OR conversation_handle > @endHandle)
    ORDER BY conversation_handle;
    IF @nextHandle IS NULL BREAK;
    SET @endHandle = @nextHandle;
    RECEIVE ${RECEIVED_COLUMNS} FROM ${quoteBrokerObject(queue.queue)} INTO @received
    WHERE conversation_handle = @endHandle;
    BEGIN TRY
      END CONVERSATION @endHandle;
      SET @moveEnded = @moveEnded + 1;
    END TRY
    BEGIN CATCH
      -- Already ended (by an administrator, or the handle is gone): nothing to do, unless the
      -- error doomed the transaction (then the outer CATCH rolls it back whole).
      SET @endError = ERROR_NUMBER();
      IF @endError NOT IN (${MSSQL_HANDLE_NOT_FOUND}, ${MSSQL_END_STATE_ERROR}) OR XACT_STATE() <> 1 THROW;
    END CATCH;
  END;
  SET @moveCount = (SELECT COUNT(*) FROM @received);
  INSERT INTO @jobs ([Ord], [Queue], [Payload], [Priority], [RunAt], [DelayMs], [GroupKey], [IdempotencyKey],
                     [MaxAttempts], [DefaultMaxAttempts], [TraceContext])
  SELECT ROW_NUMBER() OVER (ORDER BY r.conversation_group_id, r.conversation_handle, r.message_sequence_number) - 1,
         @queue,
         (SELECT r.message_type_name AS [${f.type}],
                 CONVERT(nvarchar(36), r.conversation_handle) AS [${f.conversationHandle}],
                 CONVERT(nvarchar(36), r.conversation_group_id) AS [${f.conversationGroupId}],
                 CONVERT(varchar(20), r.message_sequence_number) AS [${f.sequence}],
                 b.[Text] AS [${f.text}],
                 CASE WHEN b.[Text] IS NULL AND b.[Kept] = 1 THEN r.message_body END AS [${f.body}],
                 CASE WHEN b.[Kept] = 0 THEN DATALENGTH(r.message_body) END AS [${f.droppedBytes}]
          FOR JSON PATH, WITHOUT_ARRAY_WRAPPER),
         0, NULL, 0, CONVERT(nvarchar(36), r.conversation_group_id), NULL, NULL, @maxAttempts, NULL
  FROM @received AS r
  CROSS APPLY (
    SELECT CASE WHEN DATALENGTH(r.message_body) > ${keep} THEN 0 ELSE 1 END AS [Kept],
      CASE WHEN DATALENGTH(r.message_body) > ${keep} THEN NULL ELSE ${movedText(queue.format)} END AS [Text]
  ) AS b
  WHERE r.message_type_name NOT IN (${ENDING_TYPES}, ${brokerStringLiteral(BROKER_SYSTEM.DIALOG_TIMER)});
  IF EXISTS (SELECT 1 FROM @jobs)
  BEGIN
${indent(mssqlEnqueueInTransaction(schema), '    ')}
  END;
  COMMIT TRANSACTION;
END TRY
BEGIN CATCH
  IF XACT_STATE() = 1
  BEGIN
    ROLLBACK TRANSACTION ${BROKER_MOVE_SAVEPOINT};
    COMMIT TRANSACTION;
  END
  ELSE IF XACT_STATE() = -1
    ROLLBACK TRANSACTION;
  THROW;
END CATCH;
SELECT @moveCount AS [Received], (SELECT COUNT(*) FROM @jobs) AS [Moved], @moveEnded AS [Ended],
  (SELECT CONVERT(nvarchar(36), conversation_handle) AS [conversationHandle], message_body AS [body]
   FROM @received WHERE message_type_name = ${brokerStringLiteral(BROKER_SYSTEM.ERROR)}
   FOR JSON PATH) AS [Errors];`;
}

/**
 * Ends our side of conversation @handle (uniqueidentifier) in autocommit: the job of its Close
 * message ran, so every message sent on it before is handled. Ending one already ended or gone
 * (8426, 8427: the job ran again after its first run ended it) succeeds.
 */
export function endClosedConversation(): string {
  return `BEGIN TRY
  END CONVERSATION @handle;
END TRY
BEGIN CATCH
  IF ERROR_NUMBER() NOT IN (${MSSQL_HANDLE_NOT_FOUND}, ${MSSQL_END_STATE_ERROR}) THROW;
END CATCH;`;
}

/** Ends our side of conversation @handle (uniqueidentifier) inside the caller's transaction (the doorbell's rings). */
export function endConversation(): string {
  return 'END CONVERSATION @handle;';
}

function indent(text: string, by: string): string {
  return text
    .split('\n')
    .map((line) => (line === '' ? line : by + line))
    .join('\n');
}
