import { describe, expect, it } from 'vitest';
import * as q from '../../lib/src/broker/broker.reader.queries.js';
import type { BrokerObjectName } from '../../lib/src/broker/broker.types.js';
import { checkTsqlWithKnownGaps } from '../helpers/tsql-grammar.js';

/** Every batch the broker reader sends, for a module schema and a broker queue. */
function everyBatch(schema: string, queue: BrokerObjectName): [string, string][] {
  return [
    ['waitForGroup', q.waitForGroup(queue)],
    ['saveMessage', q.saveMessage()],
    ['rollbackMessage', q.rollbackMessage()],
    ['receiveFromGroup', q.receiveFromGroup(queue)],
    ['endConversation', q.endConversation()],
    ['journalAttempt', q.journalAttempt(schema)],
    ['journalFailure', q.journalFailure(schema)],
    ['journalRelease', q.journalRelease(schema)],
    ['forgetMessage', q.forgetMessage(schema)],
    ['deadLetter', q.deadLetter(schema)],
    ['drainConversationToDead', q.drainConversationToDead(schema, queue)],
    ['sweepOrphanedAttempts', q.sweepOrphanedAttempts(schema, queue)],
  ];
}

// The body is read as bytes for every format (decoded in Node), so no statement depends on the
// queue's format: two schemas and two queue names (one derived, with '.' and '-') cover them.
const CASES: [string, BrokerObjectName][] = [
  ['sqlqueue', { schema: 'sqlqueue', name: 'nestjs-sql-queue.orders' }],
  ['Queue_Schema_2', { schema: 'app', name: 'Work_Q' }],
];

describe('every T-SQL batch of the broker reader parses as T-SQL', () => {
  for (const [schema, queue] of CASES) {
    for (const [name, text] of everyBatch(schema, queue)) {
      it(`${name} (schema ${schema}, queue ${queue.schema}.${queue.name})`, () => {
        expect(checkTsqlWithKnownGaps(text).errors).toEqual([]);
      });
    }
  }

  it.each(everyBatch('sqlqueue', CASES[0]![1]))(
    '%s: each Service Broker statement starts the batch or follows a statement ended by ;',
    (_name, text) => {
      const broker =
        /\b(WAITFOR\s*\(|RECEIVE\s|GET\s+CONVERSATION\s+GROUP|END\s+CONVERSATION|SEND\s+ON|BEGIN\s+DIALOG)/g;
      for (const m of text.matchAll(broker)) {
        // Inside WAITFOR ( … ) the statement is the WAITFOR itself.
        if (/WAITFOR\s*\(\s*$/.test(text.slice(0, m.index))) continue;
        const before = text.slice(0, m.index).trimEnd();
        expect(before === '' || before.endsWith(';'), text.slice(Math.max(0, m.index! - 60), m.index! + 30)).toBe(true);
      }
    },
  );

  it('brackets the queue and the schema, and binds every value', () => {
    const text = q.drainConversationToDead('sqlqueue', { schema: 'sqlqueue', name: 'nestjs-sql-queue.orders' });
    expect(text).toContain('FROM [sqlqueue].[nestjs-sql-queue.orders] INTO @rest WHERE conversation_handle = @handle;');
    expect(text).toContain('END CONVERSATION @handle WITH ERROR = @code DESCRIPTION = @description;');
    expect(q.waitForGroup({ schema: 'a', name: 'b' })).toContain(
      'WAITFOR (GET CONVERSATION GROUP @group FROM [a].[b]), TIMEOUT @timeoutMs;',
    );
    expect(q.saveMessage()).toBe('SAVE TRANSACTION sq_message;');
    expect(q.rollbackMessage()).toBe('ROLLBACK TRANSACTION sq_message;');
  });

  it('the gate does check these forms: a broken RECEIVE or WAITFOR fails it', () => {
    const queue = { schema: 'a', name: 'b' };
    const broken = [
      q.receiveFromGroup(queue).replace('WHERE conversation_group_id = @group', 'WHERE message_type_name = @t'),
      q.waitForGroup(queue).replace('DECLARE @group uniqueidentifier;', 'DECLARE @group uniqueidentifier'),
      q.drainConversationToDead('s', queue).replace(' INTO @rest', ' INTO rest'),
    ];
    for (const text of broken) expect(checkTsqlWithKnownGaps(text).errors).not.toEqual([]);
  });

  it('the journal counts a run only when its retry is due, and reports the wait on the database clock', () => {
    const text = q.journalAttempt('sqlqueue');
    expect(text).toContain('([RetryAt] IS NULL OR [RetryAt] <= @now)');
    expect(text).toContain('DATEDIFF_BIG(millisecond, @now, [RetryAt])');
    expect(text).toContain('DECLARE @now datetime2(3) = SYSUTCDATETIME();');
    // No key-range locks: see the file's comment.
    expect(text).not.toMatch(/HOLDLOCK|SERIALIZABLE/i);
  });
});
