import { describe, expect, it, vi } from 'vitest';
import { BrokerDoorbell } from '../../lib/src/broker/activation/broker.doorbell.js';
import { doorbellRingPending, receiveRings } from '../../lib/src/broker/activation/broker.doorbell.queries.js';
import { BROKER_SYSTEM } from '../../lib/src/broker/broker.names.js';
import { resolveBrokerOptions } from '../../lib/src/broker/broker.options.js';
import { endConversation } from '../../lib/src/broker/reader/broker.receiver.queries.js';
import { BrokerSender } from '../../lib/src/broker/sender/broker.sender.js';
import { brokerSetupBatches, brokerSetupScript } from '../../lib/src/broker/setup/broker.setup.js';
import { lockDialog, openDialog } from '../../lib/src/broker/sender/broker.sender.queries.js';
import { silentLogger } from '../../lib/src/core/logger.js';
import { BrokerDriverDouble, type HeldStatement } from '../helpers/broker-driver-double.js';
import { CaptureLogger } from '../helpers/capture-logger.js';
import { FakeClock } from '../helpers/fake-clock.js';
import { MSSQL_OWN_TRANSACTION_GUARD } from '../../lib/src/store/mssql/mssql.queries.js';
import { checkTsqlWithKnownGaps } from '../helpers/tsql-grammar.js';

const options = resolveBrokerOptions({ queues: { orders: {} }, doorbell: true }, 'app', [])!;
const doorbell = options.doorbell!;

function rig(clock = new FakeClock(), logger = silentLogger) {
  const driver = new BrokerDriverDouble();
  const sender = new BrokerSender({
    driver,
    schema: 'app',
    maxPayloadBytes: 1024,
    unkeyedDialogs: 8,
    dialogRecycleMs: null,
    random: () => 0,
  });
  const bell = new BrokerDoorbell({ driver, sender, queue: doorbell, waitTimeoutMs: 5_000, logger, clock });
  return { driver, bell, clock };
}

const ring = (queue: string) => ({
  conversation_handle: 'AAAAAAAA-0000-0000-0000-000000000001',
  message_type_name: doorbell.messageType,
  message_body: Buffer.from(queue, 'utf8'),
});

describe('the table-queue doorbell (SQL Server)', () => {
  it('rings on an unkeyed dialog in a short transaction of its own', async () => {
    const { driver, bell } = rig();
    driver.on(doorbellRingPending(doorbell), () => [{ Pending: 0 }]);
    driver.on(openDialog('app', doorbell), () => [{ ConversationHandle: 'AAAAAAAA-0000-0000-0000-000000000009' }]);
    await bell.ring('emails');
    expect(driver.paramsOf(doorbellRingPending(doorbell))).toEqual({
      doorbell: { type: 'nvarchar', value: '~doorbell' },
      ringType: { type: 'nvarchar', value: 'nestjs-sql-queue/app/doorbell/ring' },
      body: { type: 'varbinary', value: Buffer.from('emails', 'utf8') },
    });
    expect(driver.paramsOf(lockDialog('app'))).toMatchObject({
      queue: { type: 'nvarchar', value: '~doorbell' },
      dialogKey: { type: 'nvarchar', value: '~unkeyed~0' },
    });
    expect(driver.calls.filter((c) => c.kind === 'commit')).toHaveLength(1);
    driver.assertDiscipline({ allEnded: true });
  });

  it('does not ring while a ring of the same table queue waits: the doorbell queue cannot pile up', async () => {
    const { driver, bell } = rig();
    driver.on(doorbellRingPending(doorbell), () => [{ Pending: 1 }]);
    await bell.ring('emails');
    expect(driver.statements('shared')).toEqual([doorbellRingPending(doorbell)]);
    driver.assertDiscipline({ allEnded: true });
  });

  it('counts a ring waiting in the outbox behind a dialog being recycled as pending (no listener ends that dialog while every consumer is down)', () => {
    const pending = doorbellRingPending(doorbell);
    expect(pending).toContain('FROM [app].[BrokerOutbox] WITH (NOLOCK)');
    expect(pending).toMatch(/\[Queue\] = @doorbell AND \[MessageTypeName\] = @ringType AND \[MessageBody\] = @body/);
  });

  it('a failed ring rolls its transaction back and rejects (the RemoteWaker logs it; polling still finds the work)', async () => {
    const { driver, bell } = rig();
    driver.on(doorbellRingPending(doorbell), () => {
      throw new Error('connection lost');
    });
    await expect(bell.ring('emails')).rejects.toThrow('connection lost');
    expect(driver.calls.some((c) => c.kind === 'rollback')).toBe(true);
  });

  it('wakes each table queue rung once per round, ends conversations that ended, commits and never rolls back', async () => {
    const { driver, bell } = rig();
    // Holds answer before scripted answers: the next wait is held from within the first answer.
    let waiting!: HeldStatement;
    driver.once(receiveRings(doorbell.queue), () => {
      waiting = driver.hold(receiveRings(doorbell.queue));
      return [
        ring('emails'),
        ring('emails'),
        ring('reports'),
        { ...ring(''), message_type_name: BROKER_SYSTEM.END_DIALOG, message_body: null },
      ];
    });
    const onWake = vi.fn();
    const stop = await bell.listen(onWake);
    await vi.waitFor(() => expect(waiting).toBeDefined());
    await waiting.reached;
    expect(onWake.mock.calls).toEqual([['emails'], ['reports']]);
    expect(driver.statements('reader')).toContain(endConversation());
    await stop();
    expect(driver.calls.filter((c) => c.kind === 'commit')).toHaveLength(2);
    expect(driver.calls.some((c) => c.kind === 'rollback')).toBe(false);
    driver.assertDiscipline({ allEnded: true });
  });

  it('stopped while its connection is being acquired, it begins no wait (nothing would cancel it)', async () => {
    const { driver, bell } = rig();
    let connected!: () => void;
    const acquired = new Promise<void>((resolve) => (connected = resolve));
    const beginReader = driver.beginReader.bind(driver);
    driver.beginReader = async () => {
      await acquired;
      return beginReader();
    };
    const stop = await bell.listen(() => undefined);
    const stopped = stop();
    connected();
    await stopped;
    expect(driver.statements('reader')).not.toContain(receiveRings(doorbell.queue));
    expect(driver.calls.some((c) => c.kind === 'rollback')).toBe(false);
    driver.assertDiscipline({ allEnded: true });
  });

  it('after a failed round it commits, says so, and tries again after a pause', async () => {
    const clock = new FakeClock();
    const logger = new CaptureLogger(false);
    const { driver, bell } = rig(clock, logger);
    let second!: HeldStatement;
    driver.once(receiveRings(doorbell.queue), () => {
      second = driver.hold(receiveRings(doorbell.queue));
      throw new Error('deadlock victim');
    });
    const stop = await bell.listen(() => undefined);
    await vi.waitFor(() => expect(logger.matching(/listening failed \(deadlock victim\)/)).toHaveLength(1));
    await clock.advance(1_250);
    await second.reached;
    await stop();
    expect(driver.calls.some((c) => c.kind === 'rollback')).toBe(false);
  });

  it('is set up with the broker objects, without event notifications (its listener always waits)', () => {
    const batches = brokerSetupBatches(options);
    expect(batches.some((b) => b.includes('CREATE QUEUE [app].[DoorbellQueue]'))).toBe(true);
    expect(batches.some((b) => b.includes('CREATE QUEUE [app].[DoorbellInitiatorQueue]'))).toBe(true);
    expect(batches.some((b) => b.includes('CREATE SERVICE [nestjs-sql-queue/app/doorbell]'))).toBe(true);
    expect(batches.some((b) => /EVENT NOTIFICATION[^;]*ON QUEUE \[app\]\.\[DoorbellQueue\]/.test(b))).toBe(false);
    expect(brokerSetupScript(options)).toContain('and the table-queue doorbell');
  });

  it.each([
    ['doorbellRingPending', doorbellRingPending(doorbell)],
    ['receiveRings', receiveRings(doorbell.queue)],
    // The first statements of transactions the driver begins carry the own-transaction guard.
    ['doorbellRingPending behind the guard', `${MSSQL_OWN_TRANSACTION_GUARD}${doorbellRingPending(doorbell)}`],
    ['receiveRings behind the guard', `${MSSQL_OWN_TRANSACTION_GUARD}${receiveRings(doorbell.queue)}`],
    ...brokerSetupBatches(options).map((text, i): [string, string] => [`setup batch ${i}`, text]),
  ])('%s parses as T-SQL', (_name, text) => {
    expect(checkTsqlWithKnownGaps(text).errors).toEqual([]);
  });
});
