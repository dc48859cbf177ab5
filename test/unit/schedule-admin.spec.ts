import { describe, expect, it, vi } from 'vitest';
import { ScheduleAdmin } from '../../lib/src/core/schedules/schedule-admin.js';
import type { ScheduleRow } from '../../lib/src/core/schedules/schedule.types.js';
import { NO_TRACING, type QueueTracer } from '../../lib/src/core/tracing.js';
import type { NewJob } from '../../lib/src/core/types.js';

const row: ScheduleRow = {
  id: 'report',
  queue: 'reports',
  cron: '* * * * * *',
  timezone: 'UTC',
  payload: '{"kind":"daily"}',
  options: '{"priority":3}',
  catchUp: 'last',
  paused: false,
  source: 'api',
  nextRunAt: new Date('2026-12-01T10:00:01.000Z'),
  lastRunAt: null,
  lastTick: null,
  createdAt: new Date('2026-12-01T00:00:00.000Z'),
  updatedAt: new Date('2026-12-01T00:00:00.000Z'),
};

function admin(now: Date, tracer?: QueueTracer) {
  const enqueued: NewJob[] = [];
  const woken: string[] = [];
  const store = {
    enqueue: vi.fn(async (jobs: readonly NewJob[]) => {
      enqueued.push(...jobs);
      return jobs.map((_, i) => ({ jobId: String(i + 1), created: true }));
    }),
    scheduleDueIn: vi.fn(async () => ({ now, dueInMs: 0 })),
    upsertSchedules: vi.fn(async () => undefined),
    getSchedule: vi.fn(async (id: string) => (id === row.id ? row : null)),
    listSchedules: vi.fn(async () => [row]),
    deleteSchedule: vi.fn(async () => true),
    setSchedulePaused: vi.fn(async (id: string) => id === row.id),
  };
  const result = new ScheduleAdmin({
    store,
    maxPayloadBytes: 1024,
    defaultMaxAttemptsFor: () => 25,
    checkQueue: (id, queue) => (queue === 'reports' ? null : `schedule '${id}': queue '${queue}' is unknown`),
    changed: () => woken.push('scheduler'),
    enqueued: (queue) => woken.push(queue),
    tracer,
  });
  return { admin: result, store, enqueued, woken };
}

describe('ScheduleAdmin.trigger', () => {
  it("runs in a send span and gives the job the caller's trace context, as an enqueue does", async () => {
    const context = '{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}';
    const sent: { queue: string; batchSize: number | null }[] = [];
    const tracer: QueueTracer = {
      ...NO_TRACING,
      send: (queue, batchSize, send) => {
        sent.push({ queue, batchSize });
        return send(context);
      },
    };
    const t = admin(new Date('2026-12-01T10:00:00.437Z'), tracer);
    await t.admin.trigger('report');
    expect(sent).toEqual([{ queue: 'reports', batchSize: null }]);
    expect(t.enqueued[0]!.traceContext).toBe(context);
    // Without a tracer (or with tracing off), the job carries none.
    const plain = admin(new Date('2026-12-01T10:00:00.437Z'));
    await plain.admin.trigger('report');
    expect(plain.enqueued[0]!.traceContext ?? null).toBeNull();
  });

  it("enqueues one job now with the schedule's payload and options, keyed by the time, and wakes its queue", async () => {
    const t = admin(new Date('2026-12-01T10:00:00.437Z'));
    const result = await t.admin.trigger('report');
    expect(result).toEqual({ jobId: '1', created: true, tick: new Date('2026-12-01T10:00:00.437Z') });
    expect(t.enqueued).toEqual([
      expect.objectContaining({
        queue: 'reports',
        payload: '{"kind":"daily"}',
        priority: 3,
        idempotencyKey: 'schedule:report:2026-12-01T10:00:00.437Z',
      }),
    ]);
    expect(t.woken).toEqual(['reports']);
  });

  it("at a whole second moves 1 ms on: its key can never be a tick's (ticks fall on whole seconds)", async () => {
    const t = admin(new Date('2026-12-01T10:00:00.000Z'));
    const result = await t.admin.trigger('report');
    expect(result.tick).toEqual(new Date('2026-12-01T10:00:00.001Z'));
    expect(t.enqueued[0]!.idempotencyKey).toBe('schedule:report:2026-12-01T10:00:00.001Z');
  });

  it('refuses an unknown id, and checks the id before any SQL', async () => {
    const t = admin(new Date());
    await expect(t.admin.trigger('nope')).rejects.toThrow("no schedule 'nope'");
    await expect(t.admin.trigger('a b')).rejects.toThrow(/schedule id 'a b' is invalid/);
    expect(t.store.enqueue).not.toHaveBeenCalled();
  });
});

describe('ScheduleAdmin.schedule', () => {
  it('checks the definition and the queue before any SQL, then upserts with the database time and wakes the scheduler', async () => {
    const t = admin(new Date('2026-12-01T10:00:00.500Z'));
    await expect(t.admin.schedule('x', { cron: '* * * * *', queue: 'elsewhere' })).rejects.toThrow(
      "schedule 'x': queue 'elsewhere' is unknown",
    );
    await expect(t.admin.schedule('x', { cron: 'every day', queue: 'reports' })).rejects.toThrow(/cron expression/);
    expect(t.store.scheduleDueIn).not.toHaveBeenCalled();
    await t.admin.schedule('report', { cron: '0 * * * *', queue: 'reports' });
    expect(t.store.upsertSchedules).toHaveBeenCalledWith([
      expect.objectContaining({ id: 'report', source: 'api', nextRunAt: new Date('2026-12-01T11:00:00.000Z') }),
    ]);
    expect(t.woken).toEqual(['scheduler']);
  });
});
