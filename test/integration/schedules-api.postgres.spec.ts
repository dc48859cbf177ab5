import { Injectable } from '@nestjs/common';
import type { INestApplicationContext } from '@nestjs/common';
import { describe, expect, it, vi } from 'vitest';
import {
  QueueHandler,
  QueueProducer,
  SQL_QUEUE_RUNTIME,
  SqlQueueConfigError,
  SqlQueueModule,
  SqlQueueValidationError,
  type JobContext,
  type ScheduleDefinition,
  type SqlQueueModuleOptions,
} from '../../lib/src/index.js';
import type { SqlQueueRuntime } from '../../lib/src/nest/sql-queue.runtime.js';
import type { PgDriver } from '../../lib/src/store/postgres/postgres.driver.js';
import { PG_URL, sql } from '../helpers/databases.js';
import { createQueueApp, queueAppSuite } from '../helpers/queue-app.js';
import { waitFor } from '../helpers/wait-for.js';

/**
 * Issue 13, recurring jobs through the Nest module and QueueProducer on PostgreSQL: the
 * `schedules` option at boot (concurrent boots, a changed cron, pruneSchedules), the API
 * (schedule, list, pause, resume, trigger, unschedule), and the errors raised before any SQL.
 */
const suite = queueAppSuite('sched_api');
/** pruneSchedules deletes every option schedule missing from the option: it gets a schema of its own. */
const prune = queueAppSuite('sched_prune');
const SECOND = 1_000;
const YEARLY = '0 0 0 1 1 *';
const EVERY_SECOND = '* * * * * *';

/** What the handler of 'api.q' saw, in order. */
const handled: { payload: unknown; schedule: JobContext['schedule']; key: string | null }[] = [];

@QueueHandler('api.q', { leaseMs: 5_000, maxReaders: 2 })
@Injectable()
class ApiQueueHandler {
  handle(payload: unknown, context: JobContext): Promise<void> {
    handled.push({ payload, schedule: context.schedule, key: context.idempotencyKey });
    return Promise.resolve();
  }
}

const bootWith = (module: Partial<SqlQueueModuleOptions>, schema = suite.schema) =>
  suite.boot({ schema, module, providers: [ApiQueueHandler] }).then((created) => created.app);

async function closeApp(app: INestApplicationContext): Promise<void> {
  suite.forget(app);
  await app.close();
}

async function dbNow(): Promise<number> {
  const [{ now }] = await sql<{ now: Date }>(PG_URL, 'SELECT now() AS now');
  return now.getTime();
}

/** Ticks of the jobs schedule `id` enqueued (from their idempotency keys), oldest first. */
async function ticksOf(id: string, schema = suite.schema): Promise<number[]> {
  const rows = await sql<{ key: string }>(
    PG_URL,
    `SELECT idempotency_key AS key FROM "${schema}".jobs WHERE idempotency_key LIKE $1 ORDER BY idempotency_key`,
    [`schedule:${id}:%`],
  );
  return rows.map((row) => Date.parse(row.key.slice(`schedule:${id}:`.length)));
}

/** Awaits a promise that must reject with an error of `type` whose message matches. */
async function rejects(call: Promise<unknown>, type: new (message: string) => Error, message: RegExp): Promise<void> {
  const error = await call.then(
    () => null,
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(type);
  expect((error as Error).message).toMatch(message);
}

describe('the schedules option at boot', () => {
  it('two applications booting at once with the same option leave one schedule', async () => {
    const schedules = { 'boot.once': { cron: YEARLY, queue: 'api.q', payload: { n: 1 } } };
    await Promise.all([bootWith({ schedules }), bootWith({ schedules })]);
    const rows = await sql<{ id: string; source: string }>(
      PG_URL,
      `SELECT id, source FROM "${suite.schema}".schedules WHERE id = 'boot.once'`,
    );
    expect(rows).toEqual([{ id: 'boot.once', source: 'options' }]);
  });

  it('a changed cron takes effect at the next tick after the boot that changes it', async () => {
    const first = await bootWith({ schedules: { 'boot.change': { cron: YEARLY, queue: 'api.q' } } });
    const yearly = await first.get(QueueProducer).getSchedule('boot.change');
    expect([yearly!.nextRunAt!.getUTCMonth(), yearly!.nextRunAt!.getUTCDate()]).toEqual([0, 1]);
    await closeApp(first);

    const before = await dbNow();
    const app = await bootWith({ schedules: { 'boot.change': { cron: EVERY_SECOND, queue: 'api.q' } } });
    const booted = await dbNow();
    const ticks = await waitFor(
      () => ticksOf('boot.change'),
      (found) => found.length > 0,
      { timeoutMs: 5_000, what: 'the changed schedule to fire' },
    );
    // The first tick of the new cron after the upsert: no earlier one, and no wait for the old cron's.
    expect(ticks[0]).toBeGreaterThan(before);
    expect(ticks[0]).toBeLessThanOrEqual(booted + SECOND);
    expect((await app.get(QueueProducer).getSchedule('boot.change'))!.cron).toBe(EVERY_SECOND);
  });

  it('pruneSchedules deletes schedules an earlier option defined and keeps those made through the API', async () => {
    const option = (ids: string[]): Record<string, ScheduleDefinition> =>
      Object.fromEntries(ids.map((id) => [id, { cron: YEARLY, queue: 'api.q' }]));
    const ids = async (app: INestApplicationContext) =>
      (await app.get(QueueProducer).listSchedules()).map((s) => `${s.id}:${s.source}`);

    const first = await bootWith({ schedules: option(['opt.keep', 'opt.drop']) }, prune.schema);
    await first.get(QueueProducer).schedule('api.keep', { cron: YEARLY, queue: 'api.q' });
    await closeApp(first);
    // Without pruneSchedules, a schedule removed from the option stays.
    const second = await bootWith({ schedules: option(['opt.keep']) }, prune.schema);
    expect(await ids(second)).toEqual(['api.keep:api', 'opt.drop:options', 'opt.keep:options']);
    await closeApp(second);
    const third = await bootWith({ schedules: option(['opt.keep']), pruneSchedules: true }, prune.schema);
    expect(await ids(third)).toEqual(['api.keep:api', 'opt.keep:options']);
  });
});

describe('QueueProducer', () => {
  it('schedule, listSchedules with next and last fire times, pause (no ticks), resume (no catch-up), unschedule', async () => {
    const app = await bootWith({});
    const producer = app.get(QueueProducer);
    // The control fires on the same cron, so "no job while paused" is shown by its ticks, not by a sleep.
    await producer.schedule('api.control', { cron: EVERY_SECOND, queue: 'api.q' });
    const created = await producer.schedule('api.every', {
      cron: EVERY_SECOND,
      queue: 'api.q',
      payload: { from: 'api' },
      catchUp: 'all',
    });
    expect(created).toMatchObject({ id: 'api.every', source: 'api', paused: false, lastRunAt: null, lastTick: null });
    expect(created.nextRunAt!.getTime()).toBeLessThanOrEqual((await dbNow()) + SECOND);

    const fired = await waitFor(
      async () => (await producer.listSchedules()).find((s) => s.id === 'api.every')!,
      (s) => s.lastTick !== null,
      { timeoutMs: 5_000, what: 'api.every to fire' },
    );
    expect(fired.lastRunAt!.getTime()).toBeGreaterThanOrEqual(fired.lastTick!.getTime());
    expect(fired.nextRunAt!.getTime()).toBeGreaterThan(fired.lastTick!.getTime());
    await waitFor(
      () => handled.filter((h) => h.schedule?.id === 'api.every'),
      (found) => found.length > 0,
      { what: 'a tick of api.every handled' },
    );
    expect(handled.find((h) => h.schedule?.id === 'api.every')!.payload).toEqual({ from: 'api' });

    await producer.pauseSchedule('api.every');
    const pausedAt = await dbNow();
    expect((await producer.getSchedule('api.every'))!.paused).toBe(true);
    await waitFor(
      () => ticksOf('api.control'),
      (ticks) => ticks.filter((tick) => tick > pausedAt).length >= 3,
      { timeoutMs: 6_000, what: 'three control ticks while api.every is paused' },
    );
    const resumedAt = await dbNow();
    expect((await ticksOf('api.every')).filter((tick) => tick > pausedAt)).toEqual([]);

    await producer.resumeSchedule('api.every');
    expect((await producer.getSchedule('api.every'))!.paused).toBe(false);
    const after = await waitFor(
      () => ticksOf('api.every'),
      (ticks) => ticks.some((tick) => tick > resumedAt),
      { timeoutMs: 5_000, what: 'api.every to fire after resume' },
    );
    // catchUp 'all', yet the paused period is not caught up: resume starts at the next tick.
    expect(after.filter((tick) => tick > pausedAt && tick <= resumedAt)).toEqual([]);

    expect(await producer.unschedule('api.every')).toBe(true);
    expect(await producer.unschedule('api.every')).toBe(false);
    expect(await producer.getSchedule('api.every')).toBeNull();
    expect((await producer.listSchedules()).map((s) => s.id)).not.toContain('api.every');
    // The jobs it enqueued stay.
    expect((await ticksOf('api.every')).length).toBeGreaterThan(0);
    await expect(producer.pauseSchedule('api.every')).rejects.toThrow(/no schedule 'api.every'/);
    await expect(producer.resumeSchedule('api.every')).rejects.toThrow(/no schedule 'api.every'/);
    await expect(producer.triggerSchedule('api.every')).rejects.toThrow(/no schedule 'api.every'/);
  });

  it('triggerSchedule enqueues one job now, outside the ticks, whose context names the schedule', async () => {
    const app = await bootWith({});
    const producer = app.get(QueueProducer);
    await producer.schedule('api.trigger', { cron: YEARLY, queue: 'api.q', payload: { t: 1 } });
    await producer.pauseSchedule('api.trigger');
    const before = await producer.getSchedule('api.trigger');

    const result = await producer.triggerSchedule('api.trigger');
    expect(result.created).toBe(true);
    const job = await waitFor(
      () => handled.find((h) => h.schedule?.id === 'api.trigger'),
      (found) => found !== undefined,
      { what: 'the triggered job to run' },
    );
    expect(job!.schedule).toEqual({ id: 'api.trigger', tick: result.tick });
    expect(job!.payload).toEqual({ t: 1 });
    expect(await ticksOf('api.trigger')).toEqual([result.tick.getTime()]);
    // A paused schedule can be triggered; its ticks stay as they were.
    const afterTrigger = await producer.getSchedule('api.trigger');
    expect(afterTrigger).toMatchObject({ paused: true, nextRunAt: before!.nextRunAt });
  });

  it('refuses a bad id, cron, time zone or queue, and a schedule: enqueue key, before any SQL', async () => {
    // No consumer, reaper, retention or scheduler: nothing else in this application runs SQL.
    const { app } = await suite.boot({
      module: {
        queues: { 'api.q': {} },
        scheduler: { enabled: false },
        reaper: { enabled: false },
        retention: { enabled: false },
      },
    });
    const producer = app.get(QueueProducer);
    // Every statement of the PostgreSQL store starts at its (private) driver: one statement,
    // a prepared one, or a transaction.
    const store = app.get<SqlQueueRuntime>(SQL_QUEUE_RUNTIME).store as unknown as { driver: PgDriver };
    const statements = (['query', 'queryPrepared', 'transaction'] as const).map((name) => vi.spyOn(store.driver, name));
    try {
      const refused = (call: Promise<unknown>, message: RegExp) => rejects(call, SqlQueueValidationError, message);
      const ok: ScheduleDefinition = { cron: YEARLY, queue: 'api.q' };
      await refused(producer.schedule('bad id!', ok), /schedule id 'bad id!' is invalid/);
      await refused(producer.schedule('x'.repeat(129), ok), /schedule id .* is invalid/);
      await refused(
        producer.schedule('c', { ...ok, cron: 'every day' }),
        /schedule 'c': cron expression 'every day' is invalid/,
      );
      await refused(producer.schedule('c', { ...ok, cron: '* * * * * * * *' }), /schedule 'c': cron expression/);
      await refused(
        producer.schedule('z', { ...ok, timezone: 'Mars/Olympus' }),
        /schedule 'z': timezone 'Mars\/Olympus' is not a known IANA time zone/,
      );
      await refused(producer.schedule('q', { ...ok, queue: 'nowhere' }), /schedule 'q': queue 'nowhere' is unknown/);
      await refused(producer.pauseSchedule('a/b'), /schedule id 'a\/b' is invalid/);
      await refused(producer.resumeSchedule(''), /schedule id '' is invalid/);
      await refused(producer.triggerSchedule('a b'), /schedule id 'a b' is invalid/);
      await refused(producer.unschedule('a:b'), /schedule id 'a:b' is invalid/);
      await refused(producer.getSchedule('a:b'), /schedule id 'a:b' is invalid/);
      await refused(
        producer.enqueue('api.q', {}, { idempotencyKey: 'schedule:boot.once:2026-01-01T00:00:00.000Z' }),
        /idempotencyKey 'schedule:boot\.once:.*' starts with 'schedule:', which is reserved/,
      );
      for (const spy of statements) expect(spy).not.toHaveBeenCalled();
      // The spies do see the store's statements: a valid call reaches them.
      await producer.getSchedule('no.such');
      expect(statements.some((spy) => spy.mock.calls.length > 0)).toBe(true);
    } finally {
      for (const spy of statements) spy.mockRestore();
    }
  });

  it('fails the boot naming a bad schedules option, before connecting', async () => {
    // Port 1: nothing listens, so reaching the database would fail with another message.
    const boot = (schedules: Record<string, ScheduleDefinition>, extra: Partial<SqlQueueModuleOptions> = {}) =>
      createQueueApp({
        schema: suite.schema,
        queueModule: SqlQueueModule.forRoot({
          connection: { dialect: 'postgres', url: 'postgres://postgres@127.0.0.1:1/none' },
          schema: suite.schema,
          queues: { 'api.q': {} },
          schedules,
          ...extra,
        }),
      });
    const refused = (created: Promise<unknown>, message: RegExp) => rejects(created, SqlQueueConfigError, message);
    await refused(
      boot({ 'b.cron': { cron: '61 * * * *', queue: 'api.q' } }),
      /schedule 'b\.cron': cron expression '61 \* \* \* \*' is invalid/,
    );
    await refused(
      boot({ 'b.zone': { cron: YEARLY, queue: 'api.q', timezone: 'Europe/Atlantis' } }),
      /schedule 'b\.zone': timezone 'Europe\/Atlantis' is not a known IANA time zone/,
    );
    await refused(
      boot({ 'b.queue': { cron: YEARLY, queue: 'nowhere' } }),
      /schedule 'b\.queue': queue 'nowhere' is unknown to this application \(known: 'api\.q'\)/,
    );
    await refused(boot({ 'bad id': { cron: YEARLY, queue: 'api.q' } }), /schedule id 'bad id' is invalid/);
    // A Service Broker queue (SQL Server only; nothing listens on port 1 either).
    await refused(
      createQueueApp({
        schema: suite.schema,
        queueModule: SqlQueueModule.forRoot({
          connection: { dialect: 'mssql', url: 'mssql://sa:x@127.0.0.1:1/none' },
          schema: 'dbo',
          broker: { queues: { orders: {} } },
          queues: { 'api.q': {} },
          schedules: { 'b.broker': { cron: YEARLY, queue: 'orders' } },
        }),
      }),
      /schedule 'b\.broker': 'orders' is a Service Broker queue; schedules enqueue into table queues/,
    );
  });
});
