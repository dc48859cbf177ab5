import { describe, expect, it } from 'vitest';
import { resolveBrokerOptions } from '../../lib/src/broker/broker.options.js';
import * as adminQueries from '../../lib/src/broker/broker.admin.queries.js';
import * as senderQueries from '../../lib/src/broker/sender/broker.sender.queries.js';
import type { ResolvedBrokerQueue } from '../../lib/src/broker/broker.types.js';
import { isLockConflict } from '../../lib/src/store/mssql/mssql.errors.js';
import { checkTsqlWithKnownGaps } from '../helpers/tsql-grammar.js';
import { MSSQL_OWN_TRANSACTION_GUARD } from '../../lib/src/store/mssql/mssql.queries.js';

/** Default names, and explicit ones in another schema. */
function queues(): [string, string, ResolvedBrokerQueue][] {
  const resolved = resolveBrokerOptions(
    {
      queues: {
        orders: {},
        'mail.out-2': {
          queue: 'ops.MailQueue',
          initiatorQueue: 'ops.MailReplies',
          service: '//example.com/mail/target',
          initiatorService: '//example.com/mail/initiator',
          contract: '//example.com/mail/contract',
          messageType: '//example.com/mail/message',
          closeMessageType: '//example.com/mail/close',
          format: 'xml',
        },
      },
    },
    'sqlqueue',
  )!;
  return resolved.queues.map((q) => ['sqlqueue', q.name, q]);
}

/** Every batch the sender and the initiator reader send. */
function everySenderBatch(schema: string, queue: ResolvedBrokerQueue): [string, string][] {
  return [
    ['lockDialog', senderQueries.lockDialog(schema)],
    ['openDialog', senderQueries.openDialog(schema, queue)],
    ['sendOnDialog', senderQueries.sendOnDialog(schema, queue)],
    ['closeDialog', senderQueries.closeDialog(schema, queue)],
    ['enqueueOutbox', senderQueries.enqueueOutbox(schema)],
    ['forgetDialog', senderQueries.forgetDialog(schema)],
    ['receiveInitiator', senderQueries.receiveInitiator(queue, 10, 5000)],
    ['giveBackInitiatorMessages', senderQueries.giveBackInitiatorMessages()],
    ['settleEndedDialog', senderQueries.settleEndedDialog(schema, queue)],
    ['brokerQueueFigures', adminQueries.brokerQueueFigures()],
    ['conversationEndpointsByState', adminQueries.conversationEndpointsByState()],
  ];
}

// Any of them may open a transaction the driver began, behind the own-transaction guard.
const cases = queues().flatMap(([schema, name, queue]) =>
  everySenderBatch(schema, queue).flatMap(([statement, text]) => [
    [`${statement} (${name})`, text] as const,
    [`${statement} (${name}) behind the own-transaction guard`, `${MSSQL_OWN_TRANSACTION_GUARD}${text}`] as const,
  ]),
);

describe('every T-SQL batch of the broker sender, initiator reader and figures', () => {
  it.each(cases)('%s parses as T-SQL', (_name, text) => {
    expect(checkTsqlWithKnownGaps(text).errors).toEqual([]);
  });

  it.each(cases)(
    '%s: each Service Broker statement starts the batch or follows a ";" or a block keyword',
    (_n, text) => {
      for (const m of text.matchAll(/\b(SEND ON|BEGIN DIALOG|END CONVERSATION|WAITFOR \(|RECEIVE TOP|THROW)\b/g)) {
        const before = text.slice(0, m.index).trimEnd();
        const ok =
          before === '' || before.endsWith(';') || /\b(BEGIN|TRY|ELSE)$/.test(before) || /\bWAITFOR \($/.test(before);
        // THROW also follows IF <condition> (the THROW's own statement is the IF's body).
        const afterIf = m[1] === 'THROW' && /\bIF [^;\n]+$/.test(before);
        expect(ok || afterIf, text.slice(Math.max(0, m.index! - 80), m.index! + 30)).toBe(true);
      }
    },
  );

  it('names the system and our own objects only as validated, bracketed identifiers or N literals', () => {
    const [, , queue] = queues()[1]!;
    const open = senderQueries.openDialog('sqlqueue', queue);
    expect(open).toContain('FROM SERVICE [//example.com/mail/initiator]');
    expect(open).toContain("TO SERVICE N'//example.com/mail/target', N'CURRENT DATABASE'");
    expect(open).toContain('ON CONTRACT [//example.com/mail/contract]');
    expect(open).toContain('WITH ENCRYPTION = OFF;');
    expect(open).not.toMatch(/LIFETIME/);
    expect(senderQueries.closeDialog('sqlqueue', queue)).toContain(
      'SEND ON CONVERSATION @handle MESSAGE TYPE [//example.com/mail/close];',
    );
    expect(senderQueries.receiveInitiator(queue, 10, 5000)).toContain('FROM [ops].[MailReplies]');
  });

  it('catches only the dialog-gone errors of SEND and END CONVERSATION, and reports XACT_STATE', () => {
    const [, , queue] = queues()[0]!;
    expect(senderQueries.sendOnDialog('sqlqueue', queue)).toContain('IF @error NOT IN (8429, 8426) THROW;');
    expect(senderQueries.forgetDialog('sqlqueue')).toContain('IF @error NOT IN (8426, 8427) THROW;');
    for (const text of [senderQueries.sendOnDialog('sqlqueue', queue), senderQueries.forgetDialog('sqlqueue')]) {
      expect(text).toContain('SET XACT_ABORT OFF;');
      expect(text).toMatch(/XACT_STATE\(\) AS \[XactState\];$/);
    }
  });

  describe('lockDialog (review 2, R2-3): a per-key application lock, no key-range lock', () => {
    const text = senderQueries.lockDialog('sqlqueue');
    const resourceOf = (batch: string) => /@resource nvarchar\(255\) = ([^;]+);/.exec(batch)?.[1];

    it('reads the row with UPDLOCK alone: no HOLDLOCK, SERIALIZABLE or other range-locking hint', () => {
      expect(text).not.toMatch(/HOLDLOCK|SERIALIZABLE|REPEATABLEREAD|TABLOCK/);
      expect(text).toContain(
        'FROM [sqlqueue].[BrokerDialogs] WITH (UPDLOCK)\nWHERE [Queue] = @queue AND [DialogKey] = @dialogKey;',
      );
    });

    it("takes sp_getapplock with LockOwner 'Transaction' before the SELECT, and only inside a transaction", () => {
      const lock = text.indexOf(
        "EXEC @lock = sys.sp_getapplock @Resource = @resource, @LockMode = 'Exclusive', @LockOwner = 'Transaction';",
      );
      expect(lock).toBeGreaterThan(0);
      expect(lock).toBeLessThan(text.indexOf('SELECT [ConversationHandle]'));
      expect(text.indexOf('IF @@TRANCOUNT = 0\n  THROW 51002, ')).toBe(0);
    });

    it('throws 51003 (a lock conflict, as the store does for key locks) when sp_getapplock returns below 0', () => {
      expect(text).toMatch(
        /IF @lock < 0\nBEGIN\n\s+SET @refused = CONCAT\(N'nestjs-sql-queue: dialog key lock not granted[^\n]+\n\s+THROW 51003, @refused, 1;\nEND;/,
      );
      expect(text.indexOf('THROW 51003')).toBeLessThan(text.indexOf('SELECT [ConversationHandle]'));
      expect(isLockConflict({ number: 51003 })).toBe(true);
    });

    it('locks per schema, queue and key: the same key in two schemas are two resources, within nvarchar(255)', () => {
      const resource = resourceOf(text);
      expect(resource).toBe(
        "N'nestjs-sql-queue:dialog:' + CONVERT(nvarchar(64), HASHBYTES('SHA2_256', CONCAT(N'sqlqueue/', @queue, N'/', @dialogKey)), 2)",
      );
      // Same schema (whatever its case: resource names compare in binary): the same resource.
      expect(resourceOf(senderQueries.lockDialog('SqlQueue'))).toBe(resource);
      expect(resourceOf(senderQueries.lockDialog('other'))).not.toBe(resource);
      expect(resourceOf(senderQueries.lockDialog('other'))).toContain("CONCAT(N'other/', @queue, N'/', @dialogKey)");
      // The prefix and 64 hex digits of SHA2_256.
      expect('nestjs-sql-queue:dialog:'.length + 64).toBeLessThanOrEqual(255);
    });
  });

  it('settleEndedDialog reads the closing row with UPDLOCK alone (no range lock on the handle index)', () => {
    const [, , queue] = queues()[0]!;
    const text = senderQueries.settleEndedDialog('sqlqueue', queue);
    expect(text).not.toMatch(/HOLDLOCK|SERIALIZABLE/);
    expect(text).toContain(
      "IF @state = 'C'\n  SELECT @dialogKey = [DialogKey], @state = [State]\n  FROM [sqlqueue].[BrokerDialogs] WITH (UPDLOCK)\n",
    );
  });

  it('the gate rejects a broken SEND (the check is not vacuous)', () => {
    const [, , queue] = queues()[0]!;
    const broken = senderQueries.sendOnDialog('sqlqueue', queue).replace('MESSAGE TYPE', 'MESSAGE KIND');
    expect(checkTsqlWithKnownGaps(broken).errors).not.toEqual([]);
  });

  it('refuses a TOP or TIMEOUT that is not a bounded integer', () => {
    const [, , queue] = queues()[0]!;
    expect(() => senderQueries.receiveInitiator(queue, 0, 5000)).toThrow(/TOP must be an integer from 1 to 1000/);
    expect(() => senderQueries.receiveInitiator(queue, 10, 1.5)).toThrow(/timeout must be an integer/);
  });
});
