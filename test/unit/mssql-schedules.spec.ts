import sql from 'mssql';
import { afterEach, describe, expect, it, vi } from 'vitest';
import type { ScheduleFiring, ScheduleRow } from '../../lib/src/core/schedules/schedule.types.js';
import { mssqlQueries } from '../../lib/src/store/mssql/mssql.queries.js';
import { MssqlQueueStore } from '../../lib/src/store/mssql/mssql.store.js';

/** fireDueSchedules' round trips against a driver double: which statements, in which transaction, and its end. */
function scriptedFire(answer: (name: string) => Record<string, unknown>[]) {
  const byText = new Map(Object.entries(mssqlQueries('sqlqueue')).map(([name, text]) => [text, name]));
  const log: string[] = [];
  // begin() is overloaded (callback form returns the transaction); the store awaits the promise form.
  vi.spyOn(sql.Transaction.prototype, 'begin').mockImplementation(function (this: sql.Transaction) {
    log.push('begin');
    return Promise.resolve(this) as unknown as sql.Transaction;
  });
  vi.spyOn(sql.Transaction.prototype, 'commit').mockImplementation(async () => void log.push('commit'));
  vi.spyOn(sql.Transaction.prototype, 'rollback').mockImplementation(async () => void log.push('rollback'));
  vi.spyOn(sql.Request.prototype, 'query').mockImplementation(async function (this: sql.Request, text: unknown) {
    const name = byText.get(text as string) ?? 'unknown';
    const inTransaction = (this as unknown as { parent: unknown }).parent instanceof sql.Transaction;
    log.push(`${name}${inTransaction ? ' (in transaction)' : ''}`);
    return { recordset: answer(name) } as never;
  });
  const pool = { connected: true, request: () => new sql.Request() };
  return { store: new MssqlQueueStore(pool as unknown as sql.ConnectionPool, false, 'sqlqueue'), log };
}

const now = new Date('2026-12-01T02:30:00.500Z');
const due = {
  Id: 'report.daily',
  Queue: 'reports',
  Cron: '30 2 * * *',
  Timezone: 'UTC',
  Payload: '{}',
  Options: '{}',
  CatchUp: 'last',
  Paused: false,
  Source: 'options',
  NextRunAt: new Date('2026-12-01T02:30:00.000Z'),
  LastRunAt: null,
  LastTick: null,
  CreatedAt: now,
  UpdatedAt: now,
  Now: now,
};

function firing(row: ScheduleRow): ScheduleFiring {
  return {
    id: row.id,
    jobs: [
      {
        queue: row.queue,
        payload: '{}',
        priority: 0,
        runAt: null,
        delayMs: 0,
        groupKey: null,
        concurrencyKey: null,
        idempotencyKey: `schedule:${row.id}:${row.nextRunAt!.toISOString()}`,
        maxAttempts: null,
        defaultMaxAttempts: 3,
      },
    ],
    nextRunAt: new Date('2026-12-02T02:30:00.000Z'),
    lastTick: row.nextRunAt,
  };
}

describe('MssqlQueueStore.fireDueSchedules (issue 13)', () => {
  afterEach(() => vi.restoreAllMocks());

  it('locks, plans on the round time, enqueues and advances in one transaction, then commits', async () => {
    const { store, log } = scriptedFire((name) =>
      name === 'scheduleLockDue' ? [due] : name === 'enqueueOne' ? [{ Id: '7', Created: false }] : [],
    );
    const seen: Date[] = [];
    const fired = await store.fireDueSchedules(10, (rows, at) => {
      seen.push(at);
      return rows.map(firing);
    });
    expect(seen).toEqual([now]);
    expect(fired.map((f) => f.id)).toEqual(['report.daily']);
    // A tick already in the queue (Created: false) does not fail the round.
    expect(log).toEqual([
      'begin',
      'scheduleLockDue (in transaction)',
      'enqueueOne (in transaction)',
      'scheduleAdvance (in transaction)',
      'commit',
    ]);
  });

  it('commits at once when nothing is due, without asking the plan', async () => {
    const { store, log } = scriptedFire(() => []);
    const plan = vi.fn(() => []);
    expect(await store.fireDueSchedules(10, plan)).toEqual([]);
    expect(plan).not.toHaveBeenCalled();
    expect(log).toEqual(['begin', 'scheduleLockDue (in transaction)', 'commit']);
  });

  it.each([
    [
      'the plan throws',
      () => () => {
        throw new Error('plan failed');
      },
      'plan failed',
    ],
    [
      'the plan names a schedule it was not given',
      () => (rows: readonly ScheduleRow[]) => rows.map((row) => ({ ...firing(row), id: 'other' })),
      "schedule 'other'",
    ],
  ])('rolls back and rethrows when %s', async (_what, make, message) => {
    const { store, log } = scriptedFire((name) => (name === 'scheduleLockDue' ? [due] : []));
    await expect(store.fireDueSchedules(10, make() as never)).rejects.toThrow(message);
    expect(log).toEqual(['begin', 'scheduleLockDue (in transaction)', 'rollback']);
  });

  it('rolls back and rethrows a failed enqueue (a deadlock victim is not retried inside the round)', async () => {
    const { store, log } = scriptedFire((name) => {
      if (name === 'enqueueOne') throw Object.assign(new Error('deadlock victim'), { number: 1205 });
      return name === 'scheduleLockDue' ? [due] : [];
    });
    await expect(store.fireDueSchedules(10, (rows) => rows.map(firing))).rejects.toThrow('deadlock victim');
    expect(log).toEqual(['begin', 'scheduleLockDue (in transaction)', 'enqueueOne (in transaction)', 'rollback']);
  });
});
