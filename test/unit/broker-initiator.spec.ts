import { describe, expect, it } from 'vitest';
import { BrokerInitiatorReader } from '../../lib/src/broker/sender/broker.initiator.js';
import { BROKER_SYSTEM } from '../../lib/src/broker/broker.names.js';
import { resolveBrokerOptions } from '../../lib/src/broker/broker.options.js';
import * as q from '../../lib/src/broker/sender/broker.sender.queries.js';
import { CaptureLogger } from '../helpers/capture-logger.js';
import { BrokerDriverDouble, brokerError } from '../helpers/broker-driver-double.js';

const S = 'sqlqueue';
const OLD = '11111111-1111-1111-1111-111111111111';
const NEW = '22222222-2222-2222-2222-222222222222';
const orders = resolveBrokerOptions({ queues: { orders: {} } }, S)!.queues[0]!;
const RECEIVE = q.receiveInitiator(orders, 50, 5000);
const SETTLE = q.settleEndedDialog(S, orders);

function label(text: string): string {
  if (text === RECEIVE) return 'receive';
  if (text === SETTLE) return 'settle';
  if (text === q.giveBackInitiatorMessages()) return 'giveBack';
  return text;
}

function setup() {
  const driver = new BrokerDriverDouble({ strict: true });
  driver.on(q.giveBackInitiatorMessages(), () => []);
  const logger = new CaptureLogger();
  const reader = new BrokerInitiatorReader({ driver, schema: S, queue: orders, waitTimeoutMs: 5000, logger });
  return { driver, logger, reader, log: () => driver.log(label) };
}

const endDialog = (handle = OLD) => ({
  conversation_handle: handle,
  message_type_name: BROKER_SYSTEM.END_DIALOG,
  message_body: null,
});

describe('BrokerInitiatorReader', () => {
  it('an empty wait commits and reports empty', async () => {
    const { driver, reader, log } = setup();
    driver.on(RECEIVE, () => []);
    await expect(reader.runOnce()).resolves.toBe('empty');
    expect(log()).toEqual(['reader#1 begin', 'reader#1 receive', 'reader#1 commit']);
    driver.assertDiscipline({ allEnded: true });
  });

  it('EndDialog on a closing dialog: ends our side and flushes the outbox in order on a new dialog, in one transaction', async () => {
    const { driver, reader, log, logger } = setup();
    driver.once(RECEIVE, () => [endDialog()]);
    driver.on(SETTLE, () => [{ DialogKey: 'customer-7', State: 'C', NewHandle: NEW, Flushed: '3' }]);
    await expect(reader.runOnce()).resolves.toBe('handled');
    expect(log()).toEqual(['reader#1 begin', 'reader#1 receive', 'reader#1 settle', 'reader#1 commit']);
    expect(driver.paramsOf(SETTLE)).toEqual({
      queue: { type: 'nvarchar', value: 'orders' },
      handle: { type: 'uniqueidentifier', value: OLD },
    });
    expect(logger.lines.map((l) => l.message)).toContain(
      `broker queue 'orders': dialog ${OLD} of key 'customer-7' ended; 3 waiting message(s) sent on new dialog ${NEW}`,
    );
    // The statement itself: END CONVERSATION, then the outbox in Id order on the new dialog, then
    // the old rows deleted and the new dialog recorded active.
    const endAt = SETTLE.indexOf('END CONVERSATION @handle;');
    const beginAt = SETTLE.indexOf('BEGIN DIALOG CONVERSATION @dialog');
    const sendAt = SETTLE.indexOf('SEND ON CONVERSATION @dialog');
    const deleteOutboxAt = SETTLE.indexOf('DELETE FROM [sqlqueue].[BrokerOutbox]');
    const insertAt = SETTLE.indexOf("VALUES (@queue, @dialogKey, @dialog, 'A', @sent)");
    expect([endAt, beginAt, sendAt, deleteOutboxAt, insertAt].every((at, i, all) => at > (all[i - 1] ?? -1))).toBe(
      true,
    );
    expect(SETTLE).toMatch(
      /WHERE \[Queue\] = @queue AND \[DialogKey\] = @dialogKey AND \[Id\] > @rowId\s+ORDER BY \[Id\];/,
    );
  });

  it('Error: logs its code and description, ends our side and forgets the dialog row', async () => {
    const { driver, reader, log, logger } = setup();
    const xml =
      '<Error xmlns="http://schemas.microsoft.com/SQL/ServiceBroker/Error"><Code>50001</Code><Description>message 4 is dead</Description></Error>';
    driver.once(RECEIVE, () => [
      { conversation_handle: OLD, message_type_name: BROKER_SYSTEM.ERROR, message_body: Buffer.from(xml, 'utf16le') },
    ]);
    driver.on(SETTLE, () => [{ DialogKey: 'k', State: 'A', NewHandle: null, Flushed: '0' }]);
    await expect(reader.runOnce()).resolves.toBe('handled');
    expect(log()).toEqual(['reader#1 begin', 'reader#1 receive', 'reader#1 settle', 'reader#1 commit']);
    expect(logger.lines).toContainEqual({
      level: 'warn',
      message: `broker queue 'orders': the target ended dialog ${OLD} with error 50001: message 4 is dead`,
    });
    expect(SETTLE).toContain(
      'DELETE FROM [sqlqueue].[BrokerDialogs] WHERE [Queue] = @queue AND [DialogKey] = @dialogKey AND [ConversationHandle] = @handle;',
    );
  });

  it('settles each conversation once, and drops an unexpected message type with a warning', async () => {
    const { driver, reader, logger } = setup();
    driver.once(RECEIVE, () => [
      { conversation_handle: OLD, message_type_name: BROKER_SYSTEM.DIALOG_TIMER, message_body: null },
      endDialog(OLD),
      endDialog(NEW),
    ]);
    driver.on(SETTLE, () => [{ DialogKey: null, State: null, NewHandle: null, Flushed: 0 }]);
    await reader.runOnce();
    expect(driver.statements().filter((t) => t === SETTLE)).toHaveLength(2);
    expect(
      driver.calls
        .filter((c) => c.kind === 'query' && c.text === SETTLE)
        .map((c) => c.kind === 'query' && c.params.handle!.value),
    ).toEqual([OLD, NEW]);
    expect(logger.lines.some((l) => /unexpected message type .*DialogTimer/.test(l.message))).toBe(true);
  });

  it('a failing statement of ours returns the messages (rollback to the savepoint), commits, and rejects', async () => {
    const { driver, reader, log } = setup();
    driver.once(RECEIVE, () => [endDialog()]);
    driver.on(SETTLE, () => {
      throw brokerError(8427, 'The conversation endpoint is not in a valid state for END CONVERSATION');
    });
    await expect(reader.runOnce()).rejects.toThrow(/not in a valid state for END CONVERSATION/);
    expect(log()).toEqual([
      'reader#1 begin',
      'reader#1 receive',
      'reader#1 settle',
      'reader#1 giveBack',
      'reader#1 commit',
    ]);
    driver.assertDiscipline({ allEnded: true });
  });

  it('a doomed transaction is rolled back in full (nothing else can end it)', async () => {
    const { driver, reader, log } = setup();
    driver.once(RECEIVE, () => [endDialog()]);
    driver.on(SETTLE, () => {
      throw brokerError(3930, 'doomed', { dooms: true });
    });
    await expect(reader.runOnce()).rejects.toThrow(/doomed/);
    expect(log().slice(-2)).toEqual(['reader#1 giveBack', 'reader#1 rollback']);
  });

  it('stop() cancels an idle wait; the transaction commits and runOnce reports stopped', async () => {
    const { driver, reader, log } = setup();
    const held = driver.hold(RECEIVE);
    const run = reader.runOnce();
    await held.reached;
    await reader.stop();
    await expect(run).resolves.toBe('stopped');
    expect(log()).toEqual(['reader#1 begin', 'reader#1 receive', 'reader#1 cancel', 'reader#1 commit']);
    await expect(reader.runOnce()).resolves.toBe('stopped');
    expect(driver.sessions).toHaveLength(1);
    driver.assertDiscipline({ allEnded: true });
  });

  it('a failed wait (not a cancel) commits the empty transaction and rejects', async () => {
    const { driver, reader, log } = setup();
    driver.on(RECEIVE, () => {
      throw brokerError(9617, 'The service queue is currently disabled');
    });
    await expect(reader.runOnce()).rejects.toThrow(/disabled/);
    expect(log()).toEqual(['reader#1 begin', 'reader#1 receive', 'reader#1 commit']);
  });
});
