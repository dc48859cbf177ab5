import { describe, expect, it } from 'vitest';
import {
  endBrokenNotificationDialog,
  pollBrokerQueue,
  readBrokerQueueHealth,
  readBrokerQueueLocks,
  receiveNotifications,
} from '../../lib/src/broker/activation/broker.listener.queries.js';
import { MSSQL_OWN_TRANSACTION_GUARD } from '../../lib/src/store/mssql/mssql.queries.js';
import { checkTsqlWithKnownGaps } from '../helpers/tsql-grammar.js';

/** Every statement of the activation listener, the slow poll and the health reading. */
function everyStatement(schema: string): [string, string][] {
  const queue = { schema, name: 'orders_TargetQueue' };
  return [
    ['receive notifications', receiveNotifications({ schema, name: 'BrokerActivationQueue' })],
    [
      'receive notifications behind the own-transaction guard',
      `${MSSQL_OWN_TRANSACTION_GUARD}${receiveNotifications({ schema, name: 'BrokerActivationQueue' })}`,
    ],
    ['end broken notification dialog', endBrokenNotificationDialog()],
    ['poll queue', pollBrokerQueue(queue)],
    ['queue health', readBrokerQueueHealth()],
    ['queue locks', readBrokerQueueLocks()],
  ];
}

describe('activation listener statements pass the T-SQL grammar gate', () => {
  for (const schema of ['sqlqueue', 'Queue_Schema_2']) {
    for (const [name, text] of everyStatement(schema)) {
      it(`${name} (schema ${schema})`, () => {
        expect(checkTsqlWithKnownGaps(text).errors).toEqual([]);
      });
    }
  }

  it.each(everyStatement('sqlqueue'))(
    '%s: every Service Broker statement starts the batch or follows a statement ended with ;',
    (_name, text) => {
      for (const m of text.matchAll(/\b(WAITFOR|RECEIVE|END\s+CONVERSATION|GET\s+CONVERSATION\s+GROUP)\b/g)) {
        if (m[1] === 'RECEIVE' && /WAITFOR\s*\(\s*$/.test(text.slice(0, m.index))) continue; // inside WAITFOR (…)
        const before = text.slice(0, m.index).trimEnd();
        expect(before === '' || before.endsWith(';'), text.slice(Math.max(0, m.index - 60), m.index + 20)).toBe(true);
      }
    },
  );

  it('the RECEIVE is checked as the documented form (a known grammar gap), not skipped', () => {
    const result = checkTsqlWithKnownGaps(receiveNotifications({ schema: 'sqlqueue', name: 'BrokerActivationQueue' }));
    expect(result.gapStatements.map((s) => s.gap)).toEqual(['waitfor-receive']);
  });

  it('values are bound parameters and names bracketed identifiers', () => {
    const receive = receiveNotifications({ schema: 'sqlqueue', name: 'BrokerActivationQueue' });
    expect(receive).toContain('FROM [sqlqueue].[BrokerActivationQueue] INTO @received');
    expect(receive).toContain('TIMEOUT @timeoutMs;');
    expect(receive).toContain('= @eventNotificationType');
    expect(receive).not.toMatch(/https?:/); // system names travel as parameters
    expect(pollBrokerQueue({ schema: 'sqlqueue', name: 'orders_TargetQueue' })).toContain(
      'FROM [sqlqueue].[orders_TargetQueue] WITH (NOLOCK) WHERE status = 1',
    );
    for (const [, text] of everyStatement('sqlqueue')) expect(text).not.toMatch(/\$\{|undefined/);
  });
});
