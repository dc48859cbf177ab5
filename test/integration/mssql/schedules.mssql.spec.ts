/**
 * Recurring jobs on SQL Server (issue 13), on both databases, for what only a live server can
 * show (the shared contract block 'recurring jobs (schedules)' covers the rest):
 * - many sessions firing at once, round after round, never fire a schedule's tick twice;
 * - a caller's open transaction on one schedule row holds up neither the fire of the others
 *   nor the idle poll (READPAST), whether it locked the row only or its due-index entry too;
 * - boots upserting overlapping sets of new schedules in crossing orders neither deadlock nor
 *   fail, and leave one row per id.
 */
import sql from 'mssql';
import { afterAll, expect, it } from 'vitest';
import type { QueueStore } from '../../../lib/src/core/queue-store.js';
import type { ScheduleUpsert } from '../../../lib/src/core/schedules/schedule.types.js';
import { createMssqlStore } from '../../../lib/src/store/mssql/mssql.connect.js';
import type { MssqlQueueStore } from '../../../lib/src/store/mssql/mssql.store.js';
import { within } from '../../helpers/drills.js';
import { fireNextHour, later } from '../../helpers/schedules.js';
import { beginCallerTransaction, mssqlRows, withErrorNumber } from '../../helpers/mssql.js';
import { describeEachMssqlDatabase, useMssqlSchema } from './mssql-databases.js';

const FIRERS = 8;
const ROUNDS = 10;
const SCHEDULES = 30;
/** Far below the 15 s request timeout a fire waiting on an open transaction would hit. */
const PROMPTLY_MS = 5_000;

function upsert(id: string, queue: string, nextRunAt: Date | null): ScheduleUpsert {
  return {
    id,
    queue,
    cron: '0 * * * *',
    timezone: 'UTC',
    payload: '{}',
    options: '{}',
    catchUp: 'last',
    source: 'api',
    nextRunAt,
  };
}

const fireNext = fireNextHour;

describeEachMssqlDatabase('recurring jobs under concurrency', (db) => {
  const { schema, store: queueStore, newQueue } = useMssqlSchema(db, 'sched', 4);
  const store = queueStore as MssqlQueueStore;
  const others: QueueStore[] = [];
  afterAll(() => Promise.all(others.map((other) => other.close())));
  const open = (count: number) => {
    const opened = Array.from({ length: count }, () => createMssqlStore({ url: db.url, poolSize: 2 }, { schema }));
    others.push(...opened);
    return opened as MssqlQueueStore[];
  };
  const schedules = `[${schema}].[Schedules]`;
  const jobs = `[${schema}].[Jobs]`;

  const clear = async () => {
    for (const row of await store.listSchedules()) await store.deleteSchedule(row.id);
  };

  it(`${FIRERS} sessions fire ${SCHEDULES} due schedules at once, ${ROUNDS} rounds: each tick fires exactly once`, async () => {
    await clear();
    const queue = newQueue('fire-race');
    const ids = Array.from({ length: SCHEDULES }, (_, i) => `race.${i}`);
    const now = (await store.scheduleDueIn()).now;
    await store.upsertSchedules(ids.map((id) => upsert(id, queue, later(now, -1000))));
    const firers = open(FIRERS);
    await Promise.all(firers.map((f) => f.ping(10_000)));
    const problems: string[] = [];
    for (let round = 0; round < ROUNDS && problems.length === 0; round++) {
      if (round > 0) {
        // Due again, at a tick of its own per round (so its key is new): one second before the
        // database's now, which only grows from round to round. (An offset of -round seconds
        // would repeat an earlier round's tick whenever rounds happened to be 1 s apart.)
        await mssqlRows(
          db.url,
          `UPDATE ${schedules} SET [NextRunAt] = DATEADD(second, -1, SYSUTCDATETIME()) WHERE [Queue] = @queue;`,
          (r) => r.input('queue', sql.NVarChar(128), queue),
        );
      }
      const fired = await Promise.all(
        firers.map(async (firer, i) => {
          const mine: string[] = [];
          for (;;) {
            const firings = await withErrorNumber(firer.fireDueSchedules(4, fireNext), `round ${round}: firer ${i}`);
            if (firings.length === 0) return mine;
            mine.push(...firings.map((firing) => firing.id));
          }
        }),
      );
      const all = fired.flat().sort();
      if (all.join() !== [...ids].sort().join()) problems.push(`round ${round}: fired ${JSON.stringify(all)}`);
      const [count] = await mssqlRows<{ Jobs: number; Keys: number }>(
        db.url,
        `SELECT COUNT(*) AS [Jobs], COUNT(DISTINCT [IdempotencyKey]) AS [Keys] FROM ${jobs} WHERE [Queue] = @queue;`,
        (r) => r.input('queue', sql.NVarChar(128), queue),
      );
      if (count!.Jobs !== SCHEDULES * (round + 1) || count!.Keys !== count!.Jobs) {
        problems.push(`round ${round}: ${count!.Jobs} jobs, ${count!.Keys} keys`);
      }
    }
    expect(problems).toEqual([]);
    expect((await store.scheduleDueIn()).dueInMs).toBeGreaterThan(0);
  });

  it.each([
    ['its row only (a payload change)', 'SET [Payload] = N\'{"held":true}\''],
    ['its row and its due-index entry (a next-run change)', 'SET [NextRunAt] = DATEADD(second, -5, [NextRunAt])'],
  ])(
    "a caller's open transaction holding %s holds up neither the fire of the other schedules nor the idle poll",
    async (_what, change) => {
      await clear();
      const queue = newQueue('held');
      const now = (await store.scheduleDueIn()).now;
      await store.upsertSchedules([
        upsert('held.a', queue, later(now, -2000)),
        upsert('held.b', queue, later(now, -1000)),
      ]);
      const caller = await beginCallerTransaction(db.url);
      try {
        await new sql.Request(caller.transaction)
          .input('id', sql.NVarChar(128), 'held.a')
          .query(`UPDATE ${schedules} ${change} WHERE [Id] = @id;`);
        const poll = await within(store.scheduleDueIn(), PROMPTLY_MS, 'the idle poll');
        // The held row is read past: the earliest it sees is the other one, due already.
        expect(poll.dueInMs).not.toBeNull();
        expect(poll.dueInMs!).toBeLessThanOrEqual(0);
        const fired = await within(store.fireDueSchedules(10, fireNext), PROMPTLY_MS, 'the fire');
        expect(fired.map((firing) => firing.id)).toEqual(['held.b']);
        await caller.commit();
      } finally {
        await caller.close();
      }
      // Released: the held schedule fires now.
      expect((await store.fireDueSchedules(10, fireNext)).map((firing) => firing.id)).toEqual(['held.a']);
      expect((await store.stats(queue)).ready).toBe(2);
    },
  );

  it('boots upserting overlapping sets of new schedules in crossing orders neither deadlock nor fail', async () => {
    await clear();
    const queue = newQueue('boot');
    const upserters = open(FIRERS);
    await Promise.all(upserters.map((u) => u.ping(10_000)));
    for (let round = 0; round < ROUNDS; round++) {
      const pool = Array.from({ length: 12 }, (_, i) => `boot.${round}.${String(i).padStart(2, '0')}`);
      await Promise.all(
        upserters.map((upserter, i) => {
          // Six ids each, overlapping the neighbours' sets, every other one in reverse order.
          const mine = pool.slice(i % 6, (i % 6) + 6).map((id) => upsert(id, queue, null));
          return withErrorNumber(
            upserter.upsertSchedules(i % 2 === 0 ? mine : mine.reverse()),
            `round ${round}: upserter ${i}`,
          );
        }),
      );
    }
    const rows = await store.listSchedules();
    expect(rows.length).toBe(new Set(rows.map((row) => row.id)).size);
    expect(rows.length).toBe(ROUNDS * 11);
  });
});
