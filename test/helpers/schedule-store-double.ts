import type { NewJob } from '../../lib/src/core/types.js';
import type {
  ScheduleFiring,
  ScheduleRow,
  ScheduleSource,
  ScheduleStore,
  ScheduleUpsert,
} from '../../lib/src/core/schedules/schedule.types.js';

/**
 * An in-memory ScheduleStore for engine tests: the database's clock is `now()` (tie it to a
 * FakeClock), `locked` ids stand for rows another instance holds (skipped, as by SKIP LOCKED),
 * every call is counted, and `failNext` makes the next calls reject.
 */
export class ScheduleStoreDouble implements ScheduleStore {
  readonly rows = new Map<string, ScheduleRow>();
  readonly jobs: NewJob[] = [];
  readonly locked = new Set<string>();
  readonly calls = { scheduleDueIn: 0, fireDueSchedules: 0, upsertSchedules: 0 };
  private failures: unknown[] = [];

  constructor(readonly now: () => Date) {}

  /** The next `count` statements fail with `error`. */
  failNext(error: unknown, count = 1): void {
    for (let i = 0; i < count; i++) this.failures.push(error);
  }

  private maybeFail(): void {
    if (this.failures.length > 0) throw this.failures.shift();
  }

  async scheduleDueIn(): Promise<{ now: Date; dueInMs: number | null }> {
    this.calls.scheduleDueIn++;
    this.maybeFail();
    const now = this.now();
    const due = [...this.rows.values()]
      .filter((row) => !row.paused && row.nextRunAt !== null)
      .map((row) => row.nextRunAt!.getTime());
    return { now, dueInMs: due.length === 0 ? null : Math.min(...due) - now.getTime() };
  }

  async fireDueSchedules(
    limit: number,
    plan: (rows: readonly ScheduleRow[], now: Date) => ScheduleFiring[],
  ): Promise<ScheduleFiring[]> {
    this.calls.fireDueSchedules++;
    this.maybeFail();
    const now = this.now();
    const rows = [...this.rows.values()]
      .filter((row) => !row.paused && row.nextRunAt !== null && row.nextRunAt <= now && !this.locked.has(row.id))
      .sort((a, b) => a.nextRunAt!.getTime() - b.nextRunAt!.getTime())
      .slice(0, limit)
      .map((row) => ({ ...row }));
    if (rows.length === 0) return [];
    const firings = plan(rows, now);
    for (const firing of firings) {
      const row = this.rows.get(firing.id)!;
      for (const job of firing.jobs) {
        // The second guard: a key already in the queue returns the existing job.
        if (!this.jobs.some((j) => j.idempotencyKey === job.idempotencyKey)) this.jobs.push(job);
      }
      row.nextRunAt = firing.nextRunAt;
      if (firing.jobs.length > 0) {
        row.lastRunAt = now;
        row.lastTick = firing.lastTick;
      }
      row.updatedAt = now;
    }
    return firings;
  }

  async upsertSchedules(items: readonly ScheduleUpsert[], pruneSource?: ScheduleSource): Promise<void> {
    this.calls.upsertSchedules++;
    this.maybeFail();
    const now = this.now();
    for (const item of items) {
      const old = this.rows.get(item.id);
      const timingChanged = !old || old.cron !== item.cron || old.timezone !== item.timezone;
      this.rows.set(item.id, {
        ...item,
        paused: old?.paused ?? false,
        nextRunAt: timingChanged ? item.nextRunAt : old.nextRunAt,
        lastRunAt: old?.lastRunAt ?? null,
        lastTick: old?.lastTick ?? null,
        createdAt: old?.createdAt ?? now,
        updatedAt: now,
      });
    }
    if (pruneSource) {
      const keep = new Set(items.map((item) => item.id));
      for (const row of [...this.rows.values()]) {
        if (row.source === pruneSource && !keep.has(row.id)) this.rows.delete(row.id);
      }
    }
  }

  async getSchedule(id: string): Promise<ScheduleRow | null> {
    const row = this.rows.get(id);
    return row ? { ...row } : null;
  }

  async listSchedules(): Promise<ScheduleRow[]> {
    return [...this.rows.values()].sort((a, b) => a.id.localeCompare(b.id)).map((row) => ({ ...row }));
  }

  async deleteSchedule(id: string): Promise<boolean> {
    return this.rows.delete(id);
  }

  async setSchedulePaused(id: string, paused: boolean, nextRunAt: Date | null): Promise<boolean> {
    const row = this.rows.get(id);
    if (!row) return false;
    row.paused = paused;
    if (!paused) row.nextRunAt = nextRunAt;
    row.updatedAt = this.now();
    return true;
  }
}
