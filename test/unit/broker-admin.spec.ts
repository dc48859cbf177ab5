import { describe, expect, it } from 'vitest';
import * as a from '../../lib/src/broker/broker.admin.queries.js';
import { BrokerAdmin } from '../../lib/src/broker/broker.admin.js';
import { resolveBrokerOptions } from '../../lib/src/broker/broker.options.js';
import * as q from '../../lib/src/broker/broker.sender.queries.js';
import { BrokerSender } from '../../lib/src/broker/broker.sender.js';
import { SqlQueueValidationError } from '../../lib/src/core/errors.js';
import { BrokerDriverDouble } from '../helpers/broker-driver-double.js';

const S = 'sqlqueue';
const H = '33333333-3333-3333-3333-333333333333';
const orders = resolveBrokerOptions({ queues: { orders: {} } }, S)!.queues[0]!;

function setup() {
  const driver = new BrokerDriverDouble({ strict: true });
  const sender = new BrokerSender({
    driver,
    schema: S,
    maxPayloadBytes: 1024,
    unkeyedDialogs: 8,
    dialogRecycleMs: null,
  });
  const admin = new BrokerAdmin({ driver, schema: S, sender });
  // The retry's dialog: absent until openDialog, then active; closing after closeDialog.
  let row: { ConversationHandle: string; State: string; AgeMs: string } | null = null;
  driver.on(q.lockDialog(S), () => (row ? [row] : []));
  driver.on(q.openDialog(S, orders), () => {
    row = { ConversationHandle: H, State: 'A', AgeMs: '0' };
    return [{ ConversationHandle: H, Sent: 0 }];
  });
  driver.on(q.closeDialog(S, orders), () => {
    row!.State = 'C';
    return [{ ErrorNumber: 0, XactState: 1 }];
  });
  const label = (text: string) =>
    (
      ({
        [q.lockDialog(S)]: 'lockDialog',
        [q.openDialog(S, orders)]: 'openDialog',
        [q.closeDialog(S, orders)]: 'closeDialog',
        [a.lastDeadId(S)]: 'lastDeadId',
        [a.sendDeadMessages(S, orders, 'range')]: 'sendDead range',
      }) as Record<string, string>
    )[text] ?? (text.startsWith('DECLARE @moved') ? 'sendDead ids' : text);
  return { driver, admin, log: () => driver.log(label) };
}

describe('BrokerAdmin', () => {
  it('lists dead messages with decoded bodies, an undecodable one as its bytes, and pages by id', async () => {
    const { driver, admin } = setup();
    const row = (id: number, body: Buffer) => ({
      Id: String(id),
      Queue: 'orders',
      ConversationHandle: H,
      ConversationGroupId: H,
      MessageSequenceNumber: '4',
      MessageTypeName: orders.messageType,
      MessageBody: body,
      Attempts: 5,
      Crashes: 0,
      LastError: 'boom',
      Reason: 'max-attempts',
      DeadAt: new Date(0),
    });
    driver.on(a.listDeadMessages(S), () => [row(7, Buffer.from('{"a":1}', 'utf16le')), row(9, Buffer.from('nope'))]);
    const page = await admin.listDeadMessages(orders, { limit: 2, afterId: '3' });
    expect(page.messages.map((m) => m.body)).toEqual([{ a: 1 }, Buffer.from('nope')]);
    expect(page.messages[0]).toMatchObject({
      id: '7',
      messageSequenceNumber: '4',
      attempts: 5,
      reason: 'max-attempts',
    });
    expect(page.nextAfterId).toBe('9');
    expect(driver.paramsOf(a.listDeadMessages(S))).toEqual({
      queue: { type: 'nvarchar', value: 'orders' },
      afterId: { type: 'bigint', value: '3' },
      limit: { type: 'int', value: 2 },
    });
    await expect(admin.listDeadMessages(orders, { limit: 0 })).rejects.toBeInstanceOf(SqlQueueValidationError);
  });

  it('retries given ids in id order on one new dialog, deleting them in the sending transaction, then closes it', async () => {
    const { driver, admin, log } = setup();
    driver.on(
      (t) => t.startsWith('DECLARE @moved'),
      (p) => [p.id0, p.id1, p.id2].map((v) => ({ Id: v!.value })),
    );
    await expect(admin.retryDeadMessages(orders, ['12', '3', '12', '100'])).resolves.toEqual(['3', '12', '100']);
    expect(log()).toEqual([
      'shared#1 begin',
      'shared#1 lockDialog',
      'shared#1 openDialog',
      'shared#1 sendDead ids',
      'shared#1 commit',
      'shared#2 begin',
      'shared#2 lockDialog',
      'shared#2 closeDialog',
      'shared#2 commit',
    ]);
    const params = driver.paramsOf((t) => t.startsWith('DECLARE @moved'));
    expect(params.handle).toEqual({ type: 'uniqueidentifier', value: H });
    expect(String(params.dialogKey!.value)).toMatch(/^~retry~[0-9a-f-]{36}$/);
    expect(driver.paramsOf(q.closeDialog(S, orders)).body).toEqual({ type: 'varbinary', value: null });
    driver.assertDiscipline({ allEnded: true });
  });

  it("retries 'all' in keyset batches of 1,000 up to the highest id at the start", async () => {
    const { driver, admin, log } = setup();
    driver.on(a.lastDeadId(S), () => [{ LastId: '5000' }]);
    const first = Array.from({ length: 1000 }, (_, i) => ({ Id: String(i + 1) }));
    driver.once(a.sendDeadMessages(S, orders, 'range'), () => first);
    driver.once(a.sendDeadMessages(S, orders, 'range'), () => [{ Id: '1001' }]);
    const retried = await admin.retryDeadMessages(orders, 'all');
    expect(retried).toHaveLength(1001);
    expect(driver.paramsOf(a.sendDeadMessages(S, orders, 'range'), 1)).toMatchObject({
      afterId: { type: 'bigint', value: '1000' },
      lastId: { type: 'bigint', value: '5000' },
      batch: { type: 'int', value: 1000 },
    });
    expect(log().filter((l) => /openDialog|closeDialog/.test(l))).toEqual([
      'shared#1 openDialog',
      'shared#3 closeDialog',
    ]);
  });

  it("retry 'all' of an empty dead table sends nothing and begins no dialog; bad ids fail before SQL", async () => {
    const { driver, admin } = setup();
    driver.on(a.lastDeadId(S), () => [{ LastId: null }]);
    await expect(admin.retryDeadMessages(orders, 'all')).resolves.toEqual([]);
    expect(driver.statements()).toEqual([a.lastDeadId(S)]);
    await expect(admin.retryDeadMessages(orders, ['x'])).rejects.toThrow(/is invalid: ids are decimal strings/);
    await expect(admin.retryDeadMessages(orders, [])).resolves.toEqual([]);
  });

  it('purges in statements of at most 4,000 rows until one deletes fewer', async () => {
    const { driver, admin } = setup();
    driver.once(a.purgeDeadMessages(S), () => [{ Deleted: 4000 }]);
    driver.once(a.purgeDeadMessages(S), () => [{ Deleted: 12 }]);
    await expect(admin.purgeDeadMessages(orders, { olderThanMs: 60_000 })).resolves.toBe(4012);
    expect(driver.paramsOf(a.purgeDeadMessages(S)).olderThanMs).toEqual({ type: 'bigint', value: 60_000 });
    expect(a.purgeDeadMessages(S)).toMatch(/^DELETE TOP \(4000\)/);
    await expect(admin.purgeDeadMessages(orders, { olderThanMs: -1 })).rejects.toBeInstanceOf(SqlQueueValidationError);
  });

  it('reads the queue figures from metadata and the endpoints by state', async () => {
    const { driver, admin } = setup();
    driver.on(a.brokerQueueFigures(S), () => [{ MessagesWaiting: '42', Dead: '3' }]);
    driver.on(a.conversationEndpointsByState(), () => [
      { State: 'CONVERSING', Count: '10' },
      { State: 'CLOSED', Count: '2' },
    ]);
    await expect(admin.brokerQueueFigures(orders)).resolves.toEqual({ messagesWaiting: 42, dead: 3 });
    expect(driver.paramsOf(a.brokerQueueFigures(S)).queueObject).toEqual({
      type: 'nvarchar',
      value: '[sqlqueue].[orders_TargetQueue]',
    });
    await expect(admin.conversationEndpointsByState()).resolves.toEqual({ CONVERSING: 10, CLOSED: 2 });
    expect(a.brokerQueueFigures(S)).not.toMatch(/FROM \[sqlqueue\]\.\[orders_TargetQueue\]/);
  });
});
