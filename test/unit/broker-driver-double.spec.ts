import { describe, expect, it } from 'vitest';
import { BrokerDriverDouble, brokerError } from '../helpers/broker-driver-double.js';

// The double other broker tests rely on: it must catch what a real connection would refuse.
describe('BrokerDriverDouble', () => {
  it('records calls in order and answers from the script (once before on)', async () => {
    const double = new BrokerDriverDouble();
    double.on('SELECT 1;', () => [{ n: 1 }]).once('SELECT 1;', () => [{ n: 0 }]);
    const session = await double.beginReader();
    expect(await session.query('SELECT 1;')).toEqual([{ n: 0 }]);
    expect(await session.query('SELECT 1;', { a: { type: 'int', value: 2 } })).toEqual([{ n: 1 }]);
    await session.commit();
    expect(await double.query('SELECT 2;')).toEqual([]);
    expect(double.log()).toEqual([
      'reader#1 begin',
      'reader#1 SELECT 1;',
      'reader#1 SELECT 1;',
      'reader#1 commit',
      'autocommit SELECT 2;',
    ]);
    expect(double.paramsOf('SELECT 1;')).toEqual({ a: { type: 'int', value: 2 } });
    double.assertDiscipline({ allEnded: true });
  });

  it('throws error numbers, and a dooming error makes commit fail until rollback', async () => {
    const double = new BrokerDriverDouble();
    double.once('X;', () => {
      throw brokerError(1205, 'deadlock', { dooms: true });
    });
    const session = await double.begin();
    const error = await session.query('X;').catch((e: unknown) => e);
    expect(double.errorNumber(error)).toBe(1205);
    await expect(session.commit()).rejects.toMatchObject({ number: 3930 });
    await session.rollback();
    double.assertDiscipline({ allEnded: true });
  });

  it('cancel() rejects a held statement with a cancellation and leaves the transaction open', async () => {
    const double = new BrokerDriverDouble();
    const hold = double.hold(/WAITFOR/);
    const session = await double.beginReader();
    const pending = session.query('WAITFOR (GET CONVERSATION GROUP @g FROM q), TIMEOUT 5;');
    await hold.reached;
    session.cancel();
    const error = await pending.catch((e: unknown) => e);
    expect(double.isCancelled(error)).toBe(true);
    await session.commit();
    double.assertDiscipline({ allEnded: true });
  });

  it('enforces the discipline: no statement after commit, no second request, savepoints paired', async () => {
    const double = new BrokerDriverDouble();
    const session = await double.beginReader();
    await expect(session.query('ROLLBACK TRANSACTION sq;')).rejects.toThrow(/without SAVE/);
    await session.query('SAVE TRANSACTION sq;');
    await session.query('ROLLBACK TRANSACTION sq;');
    const hold = double.hold('SLOW;');
    const slow = session.query('SLOW;');
    await expect(session.query('FAST;')).rejects.toThrow(/second request/);
    hold.release([{ ok: 1 }]);
    expect(await slow).toEqual([{ ok: 1 }]);
    await session.commit();
    await expect(session.query('LATE;')).rejects.toThrow(/after committed/);
    expect(() => double.assertDiscipline()).toThrow(/without SAVE.*second request.*after committed/);
  });

  it('strict mode refuses unscripted statements', async () => {
    const double = new BrokerDriverDouble({ strict: true });
    await expect(double.query('SELECT 3;')).rejects.toThrow(/no responder/);
  });
});
