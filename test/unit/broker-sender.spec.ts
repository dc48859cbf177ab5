import { describe, expect, it } from 'vitest';
import { resolveBrokerOptions } from '../../lib/src/broker/broker.options.js';
import * as q from '../../lib/src/broker/sender/broker.sender.queries.js';
import { BrokerSender } from '../../lib/src/broker/sender/broker.sender.js';
import type { ResolvedBrokerQueue } from '../../lib/src/broker/broker.types.js';
import { SqlQueueError, SqlQueueValidationError } from '../../lib/src/core/errors.js';
import { CaptureLogger } from '../helpers/capture-logger.js';
import { BrokerDriverDouble, brokerError } from '../helpers/broker-driver-double.js';

const S = 'sqlqueue';
const H1 = '11111111-1111-1111-1111-111111111111';
const H2 = '22222222-2222-2222-2222-222222222222';

function queue(format: 'json' | 'raw' | 'xml' = 'json'): ResolvedBrokerQueue {
  return resolveBrokerOptions({ queues: { orders: { format } } }, S)!.queues[0]!;
}

const orders = queue();

/** Labels for the double's log: each statement by its query function's name. */
function label(text: string): string {
  const names: [string, string][] = [
    ['lockDialog', q.lockDialog(S)],
    ['openDialog', q.openDialog(S, orders)],
    ['sendOnDialog', q.sendOnDialog(S, orders)],
    ['closeDialog', q.closeDialog(S, orders)],
    ['enqueueOutbox', q.enqueueOutbox(S)],
    ['forgetDialog', q.forgetDialog(S)],
  ];
  return names.find(([, sql]) => sql === text)?.[0] ?? text;
}

function setup(options: { dialogRecycleMs?: number | null; random?: () => number } = {}) {
  const driver = new BrokerDriverDouble({ strict: true });
  const logger = new CaptureLogger();
  const sender = new BrokerSender({
    driver,
    schema: S,
    maxPayloadBytes: 1024,
    unkeyedDialogs: 8,
    dialogRecycleMs: options.dialogRecycleMs === undefined ? 86_400_000 : options.dialogRecycleMs,
    logger,
    random: options.random ?? (() => 0.5),
  });
  return { driver, sender, logger, log: () => driver.log(label) };
}

/** A double that keeps BrokerDialogs rows the way the statements would. */
function withDialogTable(driver: BrokerDriverDouble, handles: string[] = [H1, H2]) {
  const rows = new Map<string, { ConversationHandle: string; State: 'A' | 'C'; AgeMs: string }>();
  const outbox: { key: string; body: Buffer }[] = [];
  const key = (p: Record<string, { value: unknown }>) => String(p.dialogKey!.value);
  driver.on(q.lockDialog(S), (p) => {
    const row = rows.get(key(p));
    return row ? [row] : [];
  });
  driver.on(q.openDialog(S, orders), (p) => {
    const handle = handles.shift()!;
    rows.set(key(p), { ConversationHandle: handle, State: 'A', AgeMs: '0' });
    return [{ ConversationHandle: handle, Sent: '1' }];
  });
  driver.on(q.sendOnDialog(S, orders), () => [{ ErrorNumber: 0, XactState: 1 }]);
  driver.on(q.enqueueOutbox(S), (p) => {
    outbox.push({ key: key(p), body: p.body!.value as Buffer });
  });
  return { rows, outbox };
}

describe('BrokerSender', () => {
  it('the first send of a key begins a dialog, records it and sends, in one transaction', async () => {
    const { driver, sender, log } = setup();
    withDialogTable(driver);
    await expect(sender.send(orders, { id: 1 }, { groupKey: 'customer-7' })).resolves.toEqual({
      conversationHandle: H1,
    });
    expect(log()).toEqual(['shared#1 begin', 'shared#1 lockDialog', 'shared#1 openDialog', 'shared#1 commit']);
    const params = driver.paramsOf(q.openDialog(S, orders));
    expect(params.queue).toEqual({ type: 'nvarchar', value: 'orders' });
    expect(params.dialogKey).toEqual({ type: 'nvarchar', value: 'customer-7' });
    expect(params.body).toEqual({ type: 'varbinary', value: Buffer.from('{"id":1}', 'utf16le') });
    driver.assertDiscipline({ allEnded: true });
  });

  it('a second send of the key reuses its dialog; another key gets a dialog of its own', async () => {
    const { driver, sender, log } = setup();
    withDialogTable(driver);
    await sender.send(orders, 1, { groupKey: 'a' });
    await expect(sender.send(orders, 2, { groupKey: 'a' })).resolves.toEqual({ conversationHandle: H1 });
    await expect(sender.send(orders, 3, { groupKey: 'b' })).resolves.toEqual({ conversationHandle: H2 });
    expect(log().filter((line) => !line.endsWith('begin') && !line.endsWith('commit'))).toEqual([
      'shared#1 lockDialog',
      'shared#1 openDialog',
      'shared#2 lockDialog',
      'shared#2 sendOnDialog',
      'shared#3 lockDialog',
      'shared#3 openDialog',
    ]);
    expect(driver.paramsOf(q.sendOnDialog(S, orders)).handle).toEqual({ type: 'uniqueidentifier', value: H1 });
  });

  it('unkeyed sends use one of unkeyedDialogs shared keys', async () => {
    const picks = [0, 0.999, 0.5];
    const { driver, sender } = setup({ random: () => picks.shift()! });
    withDialogTable(driver, [H1, H2, '33333333-3333-3333-3333-333333333333']);
    for (let i = 0; i < 3; i++) await sender.send(orders, i);
    const keys = driver.calls
      .filter((c) => c.kind === 'query' && c.text === q.lockDialog(S))
      .map((c) => (c.kind === 'query' ? c.params.dialogKey!.value : null));
    expect(keys).toEqual(['~unkeyed~0', '~unkeyed~7', '~unkeyed~4']);
  });

  it('while the key’s dialog is closing, a send goes to the outbox and returns no handle', async () => {
    const { driver, sender, log } = setup();
    const { rows, outbox } = withDialogTable(driver);
    rows.set('k', { ConversationHandle: H1, State: 'C', AgeMs: '5' });
    await expect(sender.send(orders, 'late', { groupKey: 'k' })).resolves.toEqual({ conversationHandle: null });
    expect(log()).toEqual(['shared#1 begin', 'shared#1 lockDialog', 'shared#1 enqueueOutbox', 'shared#1 commit']);
    expect(outbox).toEqual([{ key: 'k', body: Buffer.from('"late"', 'utf16le') }]);
    expect(driver.paramsOf(q.enqueueOutbox(S)).messageType).toEqual({ type: 'nvarchar', value: orders.messageType });
  });

  it('recycles a dialog older than dialogRecycleMs: Close on it, row closing, this message in the outbox', async () => {
    const { driver, sender, log, logger } = setup({ dialogRecycleMs: 1000 });
    const { rows } = withDialogTable(driver);
    rows.set('k', { ConversationHandle: H1, State: 'A', AgeMs: '1000' });
    driver.on(q.closeDialog(S, orders), () => [{ ErrorNumber: 0, XactState: 1 }]);
    await expect(sender.send(orders, { n: 1 }, { groupKey: 'k' })).resolves.toEqual({ conversationHandle: null });
    expect(log()).toEqual(['shared#1 begin', 'shared#1 lockDialog', 'shared#1 closeDialog', 'shared#1 commit']);
    const params = driver.paramsOf(q.closeDialog(S, orders));
    expect(params.handle!.value).toBe(H1);
    expect(params.body!.value).toEqual(Buffer.from('{"n":1}', 'utf16le'));
    expect(logger.lines.some((l) => /closing it/.test(l.message))).toBe(true);
  });

  it('does not recycle a younger dialog, nor ever with dialogRecycleMs null', async () => {
    for (const [recycleMs, age] of [
      [1000, '999'],
      [null, '999999999999'],
    ] as const) {
      const { driver, sender, log } = setup({ dialogRecycleMs: recycleMs });
      const { rows } = withDialogTable(driver);
      rows.set('k', { ConversationHandle: H1, State: 'A', AgeMs: age });
      await sender.send(orders, 1, { groupKey: 'k' });
      expect(log()).toContain('shared#1 sendOnDialog');
    }
  });

  it('a SEND on a dialog the target ended (8429) ends our side and sends on a new dialog in the same transaction', async () => {
    const { driver, sender, log, logger } = setup();
    const { rows } = withDialogTable(driver, [H2]);
    rows.set('k', { ConversationHandle: H1, State: 'A', AgeMs: '10' });
    driver.once(q.sendOnDialog(S, orders), () => [{ ErrorNumber: 8429, XactState: 1 }]);
    driver.on(q.forgetDialog(S), () => {
      rows.delete('k');
      return [{ XactState: 1 }];
    });
    await expect(sender.send(orders, 'kept', { groupKey: 'k' })).resolves.toEqual({ conversationHandle: H2 });
    expect(log()).toEqual([
      'shared#1 begin',
      'shared#1 lockDialog',
      'shared#1 sendOnDialog',
      'shared#1 forgetDialog',
      'shared#1 openDialog',
      'shared#1 commit',
    ]);
    expect(driver.paramsOf(q.forgetDialog(S)).handle!.value).toBe(H1);
    expect(driver.paramsOf(q.openDialog(S, orders)).body!.value).toEqual(Buffer.from('"kept"', 'utf16le'));
    expect(
      logger.lines.some((l) => l.level === 'warn' && /was ended by the target \(SEND error 8429\)/.test(l.message)),
    ).toBe(true);
  });

  it('when the failed SEND doomed the transaction, it rolls back and says so; nothing is half-sent', async () => {
    const { driver, sender, log } = setup();
    const { rows } = withDialogTable(driver);
    rows.set('k', { ConversationHandle: H1, State: 'A', AgeMs: '10' });
    driver.on(q.sendOnDialog(S, orders), () => [{ ErrorNumber: 8429, XactState: -1 }]);
    await expect(sender.send(orders, 1, { groupKey: 'k' })).rejects.toThrow(
      /doomed the transaction, so nothing was sent/,
    );
    expect(log()).toEqual(['shared#1 begin', 'shared#1 lockDialog', 'shared#1 sendOnDialog', 'shared#1 rollback']);
  });

  it('any other SQL error rolls our transaction back and reaches the caller', async () => {
    const { driver, sender, log } = setup();
    withDialogTable(driver);
    driver.on(q.openDialog(S, orders), () => {
      throw brokerError(8490, 'Cannot find the remote service');
    });
    await expect(sender.send(orders, 1, { groupKey: 'k' })).rejects.toThrow(/Cannot find the remote service/);
    expect(log().at(-1)).toBe('shared#1 rollback');
    driver.assertDiscipline({ allEnded: true });
  });

  it("in the caller's transaction it neither commits nor rolls back, also when it fails", async () => {
    const { driver, sender, log } = setup();
    withDialogTable(driver);
    const callerTransaction = { mine: true };
    await sender.send(orders, 1, { groupKey: 'k', transaction: callerTransaction });
    expect(log()).toEqual(['caller#1 begin', 'caller#1 lockDialog', 'caller#1 openDialog']);
    driver.on(q.sendOnDialog(S, orders), () => {
      throw brokerError(1205, 'deadlock victim');
    });
    await expect(sender.send(orders, 2, { groupKey: 'k', transaction: callerTransaction })).rejects.toThrow(/deadlock/);
    expect(log().slice(3)).toEqual(['caller#2 begin', 'caller#2 lockDialog', 'caller#2 sendOnDialog']);
    expect(driver.sessions.map((s) => s.kind)).toEqual(['caller', 'caller']);
  });

  it('validates options, group key and body before any SQL', async () => {
    const { driver, sender } = setup();
    const bad: [unknown, unknown, RegExp][] = [
      [1, { groupKey: '' }, /groupKey must be a non-empty string of at most 255/],
      [1, { groupKey: 'x'.repeat(256) }, /at most 255/],
      [1, { groupKey: 'k ' }, /must not end with whitespace/],
      [1, { groupKey: 7 }, /groupKey must be a non-empty string/],
      [1, { groupkey: 'k' }, /unknown option 'groupkey' \(did you mean 'groupKey'\?\)/],
      [undefined, {}, /not JSON-serializable/],
      ['x'.repeat(600), {}, /over the limit of 1024 \(maxPayloadBytes/],
    ];
    for (const [body, options, message] of bad) {
      const error = await sender.send(orders, body, options as never).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(SqlQueueValidationError);
      expect((error as Error).message).toMatch(/^send to broker queue 'orders': /);
      expect((error as Error).message).toMatch(message);
    }
    await expect(sender.send(queue('raw'), 'text')).rejects.toThrow(/format is 'raw'/);
    expect(driver.calls).toEqual([]);
  });

  it('closing only (no body) on a key without a dialog does nothing', async () => {
    const { driver, sender } = setup();
    withDialogTable(driver);
    const session = await driver.begin();
    await expect(sender.sendIn(session, orders, 'k', null)).resolves.toEqual({ conversationHandle: null });
    await session.commit();
    expect(driver.statements()).toEqual([q.lockDialog(S)]);
  });

  it('SqlQueueError is what a missing handle from BEGIN DIALOG raises', async () => {
    const { driver, sender } = setup();
    driver.on(q.lockDialog(S), () => []);
    driver.on(q.openDialog(S, orders), () => []);
    await expect(sender.send(orders, 1)).rejects.toBeInstanceOf(SqlQueueError);
  });
});
