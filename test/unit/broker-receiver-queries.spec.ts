import { constants } from 'node:buffer';
import { describe, expect, it } from 'vitest';
import { BROKER_JOB_FIELDS, BROKER_MOVE_MAX_KEPT_BYTES } from '../../lib/src/broker/reader/broker.job.js';
import { BROKER_SYSTEM } from '../../lib/src/broker/broker.names.js';
import { resolveBrokerOptions } from '../../lib/src/broker/broker.options.js';
import {
  BROKER_MOVE_LOCK_TIMEOUT_MS,
  BROKER_MOVE_SAVEPOINT,
  endClosedConversation,
  endConversation,
  moveMessages,
  waitForMessages,
} from '../../lib/src/broker/reader/broker.receiver.queries.js';
import type { ResolvedBrokerQueue } from '../../lib/src/broker/broker.types.js';
import { MSSQL_AUTOCOMMIT_SESSION, mssqlEnqueueInTransaction } from '../../lib/src/store/mssql/mssql.queries.js';
import { checkTsqlWithKnownGaps } from '../helpers/tsql-grammar.js';
import { DEFAULT_MAX_PAYLOAD_BYTES } from '../../lib/src/core/validation.js';

function queueOf(schema: string, options: Record<string, unknown> = {}): ResolvedBrokerQueue {
  return resolveBrokerOptions({ queues: { orders: options } }, schema)!.queues[0]!;
}

const schemas = ['sqlqueue', 'Queue_Schema_2'];
const formats = ['json', 'raw', 'xml'] as const;

/** The lines of `text` between its BEGIN TRANSACTION and COMMIT TRANSACTION (the move's transaction). */
function transactionOf(text: string): string {
  return text.slice(text.indexOf('BEGIN TRANSACTION;'), text.indexOf('  COMMIT TRANSACTION;\nEND TRY'));
}

describe('the receiver statements (review 2: no Service Broker transaction across a handler)', () => {
  const cases = schemas.flatMap((schema) => [
    [`waitForMessages (${schema})`, waitForMessages(queueOf(schema).queue)],
    ...formats.map((format) => [
      `moveMessages ${format} (${schema})`,
      moveMessages(schema, queueOf(schema, { format }), DEFAULT_MAX_PAYLOAD_BYTES),
    ]),
    [`endClosedConversation`, endClosedConversation()],
    [`endConversation`, endConversation()],
  ]);

  it.each(cases)('%s parses as T-SQL', (_name, text) => {
    expect(checkTsqlWithKnownGaps(text!).errors).toEqual([]);
  });

  it('the gate rejects a broken move (the check is not vacuous)', () => {
    const text = moveMessages('sqlqueue', queueOf('sqlqueue'), DEFAULT_MAX_PAYLOAD_BYTES);
    expect(checkTsqlWithKnownGaps(text.replace('FOR JSON PATH', 'FOR JSONB PATH')).errors).not.toEqual([]);
    expect(
      checkTsqlWithKnownGaps(text.replace('ROLLBACK TRANSACTION sq_move;', 'ROLLBACK sq_move TRANSACTION;')).errors,
    ).not.toEqual([]);
  });

  it('the wait runs in autocommit behind the guard: it holds nothing while it waits', () => {
    const text = waitForMessages(queueOf('sqlqueue').queue);
    expect(text.startsWith(MSSQL_AUTOCOMMIT_SESSION)).toBe(true);
    expect(text).toContain(
      'WAITFOR (GET CONVERSATION GROUP @group FROM [sqlqueue].[orders_TargetQueue]), TIMEOUT @timeoutMs;',
    );
    expect(text).not.toMatch(/BEGIN TRAN|SAVE TRAN|RECEIVE/);
    // Nothing before the WAITFOR sends a result (the driver's request timer keeps running until then).
    const beforeWait = text.slice(MSSQL_AUTOCOMMIT_SESSION.length, text.indexOf('WAITFOR'));
    expect(beforeWait.trim()).toBe('DECLARE @group uniqueidentifier;');
  });

  it('a move begins, receives, enqueues and commits in one batch, and never waits inside its transaction', () => {
    const text = moveMessages('sqlqueue', queueOf('sqlqueue'), DEFAULT_MAX_PAYLOAD_BYTES);
    expect(text.startsWith(MSSQL_AUTOCOMMIT_SESSION)).toBe(true);
    expect(text).not.toContain('WAITFOR');
    const tx = transactionOf(text);
    expect(tx).toMatch(/^BEGIN TRANSACTION;\nSAVE TRANSACTION sq_move;\nBEGIN TRY\n/);
    const receive = tx.indexOf('RECEIVE TOP (@moveLeft) conversation_group_id, conversation_handle');
    const drain = tx.indexOf('INTO @received\n    WHERE conversation_handle = @endHandle;');
    const end = tx.indexOf('END CONVERSATION @endHandle;');
    const jobs = tx.indexOf('INSERT INTO @jobs');
    const enqueue = tx.indexOf(mssqlEnqueueInTransaction('sqlqueue').split('\n')[0]!.trim());
    // Received, the rest of each ended conversation received, ended, then everything enqueued.
    expect([receive > 0, drain > receive, end > drain, jobs > end, enqueue > jobs]).toEqual([
      true,
      true,
      true,
      true,
      true,
    ]);
    // The move's own, the empty one after a give-back, and the enqueue's own, skipped (@inTransaction = 1).
    expect(text.match(/^.*\bCOMMIT TRANSACTION;/gm)!.map((line) => line.trim())).toEqual([
      'IF @inTransaction = 0 COMMIT TRANSACTION;',
      'COMMIT TRANSACTION;',
      'COMMIT TRANSACTION;',
    ]);
    expect(text.match(/^.*\bBEGIN TRANSACTION;/gm)!.map((line) => line.trim())).toEqual([
      'BEGIN TRANSACTION;',
      'IF @inTransaction = 0 BEGIN TRANSACTION;',
    ]);
    expect(BROKER_MOVE_SAVEPOINT.length).toBeLessThanOrEqual(32);
  });

  it("a move's own failure gives the messages back to the savepoint and commits; only a doomed transaction is rolled back", () => {
    const text = moveMessages('sqlqueue', queueOf('sqlqueue'), DEFAULT_MAX_PAYLOAD_BYTES);
    const handler = text.slice(text.lastIndexOf('BEGIN CATCH'));
    expect(handler).toMatch(
      /^BEGIN CATCH\n {2}IF XACT_STATE\(\) = 1\n {2}BEGIN\n {4}ROLLBACK TRANSACTION sq_move;\n {4}COMMIT TRANSACTION;\n {2}END\n {2}ELSE IF XACT_STATE\(\) = -1\n {4}ROLLBACK TRANSACTION;\n {2}THROW;\nEND CATCH;/,
    );
    // Every full ROLLBACK TRANSACTION in the batch is that doomed branch (the enqueue's own is skipped: @inTransaction = 1).
    const full = [...text.matchAll(/ROLLBACK TRANSACTION(?! sq_move)[^;]*;/g)].map((m) => m[0]);
    expect(full).toEqual(['ROLLBACK TRANSACTION;', 'ROLLBACK TRANSACTION;']);
    expect(text).toContain('IF @inTransaction = 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;');
    expect(text).toContain('DECLARE @inTransaction bit = 1;');
  });

  it('pins the session: XACT_ABORT off (an error must not doom the RECEIVE), deadlock priority high, a lock timeout, READ COMMITTED', () => {
    const text = moveMessages('sqlqueue', queueOf('sqlqueue'), DEFAULT_MAX_PAYLOAD_BYTES);
    const session = text.slice(MSSQL_AUTOCOMMIT_SESSION.length, text.indexOf('DECLARE @received'));
    expect(session.trim().split('\n')).toEqual([
      'SET TRANSACTION ISOLATION LEVEL READ COMMITTED;',
      'SET XACT_ABORT OFF;',
      'SET DEADLOCK_PRIORITY HIGH;',
      `SET LOCK_TIMEOUT ${BROKER_MOVE_LOCK_TIMEOUT_MS};`,
    ]);
    expect(text.slice(text.indexOf('DECLARE @received'))).not.toMatch(/\bSET XACT_ABORT ON\b/);
  });

  it('moves application messages as jobs of the broker queue, in conversation and sequence order, one group per conversation group', () => {
    const text = moveMessages('sqlqueue', queueOf('sqlqueue'), DEFAULT_MAX_PAYLOAD_BYTES);
    expect(text).toContain('DECLARE @jobs [sqlqueue].[JobInputListV4];');
    expect(text).toContain(
      'SELECT ROW_NUMBER() OVER (ORDER BY r.conversation_group_id, r.conversation_handle, r.message_sequence_number) - 1,',
    );
    expect(text).toContain(
      '0, NULL, 0, CONVERT(nvarchar(36), r.conversation_group_id), NULL, NULL, @maxAttempts, NULL',
    );
    expect(text).toContain(
      `WHERE r.message_type_name NOT IN (N'${BROKER_SYSTEM.END_DIALOG}', N'${BROKER_SYSTEM.ERROR}', N'${BROKER_SYSTEM.DIALOG_TIMER}');`,
    );
    // The enqueue is the store's own (ordered groups, ids, settings), not a copy.
    expect(text).toContain(
      mssqlEnqueueInTransaction('sqlqueue')
        .split('\n')
        .map((line) => (line ? `    ${line}` : line))
        .join('\n'),
    );
  });

  it('writes the payload with the field names the handler side reads (BROKER_JOB_FIELDS)', () => {
    const text = moveMessages('sqlqueue', queueOf('sqlqueue'), DEFAULT_MAX_PAYLOAD_BYTES);
    const payload = text.slice(
      text.indexOf('(SELECT r.message_type_name'),
      text.indexOf('FOR JSON PATH, WITHOUT_ARRAY_WRAPPER)'),
    );
    const aliases = [...payload.matchAll(/ AS \[(\w+)\]/g)].map((m) => m[1]);
    expect(aliases).toEqual(Object.values(BROKER_JOB_FIELDS));
    expect(text).toContain(
      `CASE WHEN DATALENGTH(r.message_body) > ${DEFAULT_MAX_PAYLOAD_BYTES} THEN 0 ELSE 1 END AS [Kept]`,
    );
  });

  it("reads a 'json' body as UTF-16LE text only when it looks like it (decodeBrokerText's rule), any other format as bytes", () => {
    const json = moveMessages('sqlqueue', queueOf('sqlqueue', { format: 'json' }), DEFAULT_MAX_PAYLOAD_BYTES);
    expect(json).toContain('AND SUBSTRING(r.message_body, 1, 1) <> 0x00 AND SUBSTRING(r.message_body, 2, 1) = 0x00');
    expect(json).toContain('THEN CAST(r.message_body AS nvarchar(max)) END');
    for (const format of ['raw', 'xml'] as const) {
      const text = moveMessages('sqlqueue', queueOf('sqlqueue', { format }), DEFAULT_MAX_PAYLOAD_BYTES);
      expect(text).not.toContain('CAST(r.message_body AS nvarchar(max))');
      expect(text).toContain('ELSE CAST(NULL AS nvarchar(max)) END AS [Text]');
    }
  });

  it('receives up to messagesPerTransaction in all, across at most 100 conversation groups', () => {
    const text = moveMessages(
      'sqlqueue',
      queueOf('sqlqueue', { messagesPerTransaction: 7 }),
      DEFAULT_MAX_PAYLOAD_BYTES,
    );
    // Each RECEIVE takes what is left, so a move never holds more than messagesPerTransaction.
    expect(text).toContain('WHILE @moveRound < 100 AND @moveCount < 7');
    expect(text).toContain('SET @moveLeft = 7 - @moveCount;');
    expect(text).toContain('RECEIVE TOP (@moveLeft) ');
    expect(text).toContain('IF @moveCount = @moveBefore BREAK;');
    expect(() =>
      moveMessages('sqlqueue', { ...queueOf('sqlqueue'), messagesPerTransaction: 0 }, DEFAULT_MAX_PAYLOAD_BYTES),
    ).toThrow(/from 1 to 1000/);
  });

  it('ends the conversations it received EndDialog or Error for, once each, tolerating one already ended', () => {
    const text = moveMessages('sqlqueue', queueOf('sqlqueue'), DEFAULT_MAX_PAYLOAD_BYTES);
    expect(text).toContain(
      `WHERE message_type_name IN (N'${BROKER_SYSTEM.END_DIALOG}', N'${BROKER_SYSTEM.ERROR}') AND (@endHandle IS NULL OR conversation_handle > @endHandle)`,
    );
    // Tolerated only while the transaction can still commit; counted only when it ended one.
    expect(text).toContain('IF @endError NOT IN (8426, 8427) OR XACT_STATE() <> 1 THROW;');
    expect(text).toContain('      END CONVERSATION @endHandle;\n      SET @moveEnded = @moveEnded + 1;\n    END TRY');
    expect(endClosedConversation()).toContain('IF ERROR_NUMBER() NOT IN (8426, 8427) THROW;');
  });

  it('receives the rest of a conversation before ending it (END CONVERSATION deletes what is left unread), then counts again', () => {
    const text = moveMessages('sqlqueue', queueOf('sqlqueue'), DEFAULT_MAX_PAYLOAD_BYTES);
    expect(text).toContain(
      '    RECEIVE conversation_group_id, conversation_handle, message_sequence_number, message_type_name, message_body FROM [sqlqueue].[orders_TargetQueue] INTO @received\n    WHERE conversation_handle = @endHandle;\n    BEGIN TRY\n      END CONVERSATION @endHandle;',
    );
    const recount = text.indexOf('SET @moveCount = (SELECT COUNT(*) FROM @received);\n  INSERT INTO @jobs');
    expect(recount).toBeGreaterThan(text.indexOf('END CONVERSATION @endHandle;'));
  });

  it("keeps a body up to the module's maxPayloadBytes, and refuses a limit Node could not read back", () => {
    const text = moveMessages('sqlqueue', queueOf('sqlqueue'), 4096);
    expect(text).toContain('CASE WHEN DATALENGTH(r.message_body) > 4096 THEN 0 ELSE 1 END AS [Kept]');
    expect(text).toContain('CASE WHEN DATALENGTH(r.message_body) > 4096 THEN NULL ELSE ');
    expect(() => moveMessages('sqlqueue', queueOf('sqlqueue'), BROKER_MOVE_MAX_KEPT_BYTES + 1)).toThrow(
      /maxPayloadBytes/,
    );
    // base64 of the largest kept body stays far below Node's longest string.
    expect(Math.ceil(BROKER_MOVE_MAX_KEPT_BYTES / 3) * 4).toBeLessThan(constants.MAX_STRING_LENGTH / 4);
  });

  it('answers one row after its commit: counts and the Error messages for the log', () => {
    const text = moveMessages('sqlqueue', queueOf('sqlqueue'), DEFAULT_MAX_PAYLOAD_BYTES);
    const answer = text.slice(text.lastIndexOf('END CATCH;'));
    expect(answer).toMatch(
      /SELECT @moveCount AS \[Received\], \(SELECT COUNT\(\*\) FROM @jobs\) AS \[Moved\], @moveEnded AS \[Ended\],/,
    );
    expect(answer).toContain(`WHERE message_type_name = N'${BROKER_SYSTEM.ERROR}'`);
    // Nothing else answers: the driver reads the last result set.
    expect(text.slice(0, text.lastIndexOf('END CATCH;'))).not.toMatch(/\nSELECT (?!TOP \(1\) @nextHandle)/);
  });
});
