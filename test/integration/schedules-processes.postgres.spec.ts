import { afterAll, afterEach, expect, it } from 'vitest';
import { dropPgSchema, PG_URL, sql, uniqueSchema } from '../helpers/databases.js';
import { waitFor } from '../helpers/wait-for.js';
import { killAllWorkers, WorkerProcess, type WorkerMessage } from '../helpers/worker-process.js';
import type { ScheduleWorkerConfig } from '../workers/schedule-worker.js';

/**
 * Issue 13's proof that a schedule fires exactly once per tick across instances: three worker
 * processes declare the same every-second schedule; one (the latest to have fired) is killed
 * with SIGKILL mid-run and replaced. The jobs table, not the handlers, is the record: one job
 * per tick, every tick from the first to the last, whichever process enqueued it.
 */
const schema = uniqueSchema('sched_procs');
afterEach(() => killAllWorkers());
afterAll(() => dropPgSchema(schema));

const SECOND = 1_000;
const RUN_TICKS = 20;

const config: ScheduleWorkerConfig = {
  url: PG_URL,
  schema,
  queue: 'ticks',
  leaseMs: 2_000,
  minReaders: 1,
  maxReaders: 2,
  schedules: { tick: { cron: '* * * * * *', queue: 'ticks', catchUp: 'all' } },
};

const start = () => WorkerProcess.start(config, 'schedule-worker.js');

/** The ticks of every job the schedule enqueued (from the idempotency key), oldest first. */
async function tickJobs(): Promise<{ id: string; tick: number; state: string }[]> {
  const rows = await sql<{ id: string; key: string; state: string }>(
    PG_URL,
    `SELECT id::text AS id, idempotency_key AS key, state FROM "${schema}".jobs
      WHERE idempotency_key LIKE 'schedule:tick:%' ORDER BY idempotency_key`,
  );
  return rows.map((row) => ({
    id: row.id,
    tick: Date.parse(row.key.slice('schedule:tick:'.length)),
    state: row.state,
  }));
}

const span = (jobs: { tick: number }[]) => (jobs.length ? jobs[jobs.length - 1]!.tick - jobs[0]!.tick : 0);

it('three processes, one SIGKILLed and replaced mid-run: every tick of 20 s enqueues exactly one job', async () => {
  const workers = await Promise.all([start(), start(), start()]);
  const fired = () => workers.flatMap((w) => w.received('fired').map((m) => ({ pid: w.pid, ticks: Number(m.ticks) })));

  // Mid-run: kill the process that fired last (so the kill hits the instance doing the work).
  await waitFor(tickJobs, (jobs) => span(jobs) >= (RUN_TICKS / 2 - 2) * SECOND, {
    timeoutMs: 20_000,
    what: 'the first half of the run',
  });
  const lastFired = await waitFor(
    () => workers.flatMap((w) => w.received('fired').map((m) => ({ worker: w, m }))).at(-1),
    (found) => found !== undefined,
    { what: 'a scheduleFired event from some worker' },
  );
  const victim = lastFired!.worker;
  victim.kill('SIGKILL');
  await victim.exited;
  workers.push(await start());

  const run = await waitFor(tickJobs, (jobs) => span(jobs) >= (RUN_TICKS - 1) * SECOND, {
    timeoutMs: 25_000,
    what: `${RUN_TICKS} ticks`,
  });
  // Every job of the run is handled, those the killed process held too (after their lease).
  const lastTick = run[run.length - 1]!.tick;
  await waitFor(tickJobs, (jobs) => jobs.filter((job) => job.tick <= lastTick).every((job) => job.state === 'done'), {
    timeoutMs: 15_000,
    what: 'every job of the run to be done',
  });
  await Promise.all(workers.filter((w) => w.alive).map((w) => w.stop()));

  const jobs = await tickJobs();
  const ticks = jobs.map((job) => job.tick);
  // One job per tick: no tick twice...
  expect(new Set(ticks).size).toBe(ticks.length);
  // ...and no gap: consecutive seconds from the first tick to the last.
  expect(ticks.length).toBeGreaterThanOrEqual(RUN_TICKS);
  expect(ticks.every((tick, i) => i === 0 || tick - ticks[i - 1]! === SECOND)).toBe(true);
  expect(ticks.every((tick) => tick % SECOND === 0)).toBe(true);

  // More than one process fired (the firing is shared, not one process's timer)...
  const firers = new Set(fired().map((f) => f.pid));
  expect(firers.size).toBeGreaterThan(1);
  // ...and no tick was planned twice and then absorbed by the idempotency key: the firings
  // reported add up to the jobs (a process killed between its commit and its report may
  // have taken one report with it).
  const reported = fired().reduce((sum, f) => sum + f.ticks, 0);
  expect(reported).toBeLessThanOrEqual(ticks.length);
  expect(reported).toBeGreaterThanOrEqual(ticks.length - 1);

  // Every tick's handler ran and saw its tick in ctx.schedule, matching the job's key.
  const ticked: WorkerMessage[] = workers.flatMap((w) => w.received('ticked'));
  for (const message of ticked) {
    expect(message.scheduleId).toBe('tick');
    expect(message.key).toBe(`schedule:tick:${String(message.tick)}`);
  }
  const handled = new Set(ticked.map((message) => Date.parse(String(message.tick))));
  expect(ticks.filter((tick) => tick <= lastTick && !handled.has(tick))).toEqual([]);
}, 60_000);
