/**
 * Exactly-once inside the database (issue 25): worker processes running transactional handlers
 * are SIGKILLed at random moments (inside handlers, inside transactions, around their commits)
 * while they drain thousands of jobs, each writing an effect row and enqueuing a follow-up job in
 * its transaction (test/workers/transactional-worker.ts). Afterwards every job is done, every done
 * job has exactly one effect row, no effect row lacks its done job, and every first-step job has
 * exactly one follow-up: what a crash interrupted rolled back whole, and what committed never ran
 * again. One drill, run on each dialect by its target.
 */
import { afterAll, afterEach, beforeAll, expect, it } from 'vitest';
import type { QueueStore } from '../../../lib/src/core/queue-store.js';
import { prepareJob } from '../../../lib/src/core/producer/job-validation.js';
import { uniqueSchema } from '../../helpers/databases.js';
import { killAllWorkers, WorkerProcess } from '../../helpers/worker-process.js';

/** What the drill's final check counts (see transactionalDrills). */
export interface ExactlyOnceReport {
  jobs: number;
  not_done: number;
  without_effect: number;
  with_two: number;
  stray: number;
  first_without_child: number;
  first_with_two: number;
  reruns: number;
}

export interface TransactionalDrillTarget {
  dialect: 'postgres' | 'mssql';
  url: string;
  openStore(schema: string): QueueStore;
  /** The effect table the worker writes (one row per committed handler run, no unique key). */
  createEffectTable(schema: string): Promise<void>;
  dropSchema(schema: string): Promise<void>;
  /** Done jobs of the queues 'tx' and 'tx-next'. */
  doneCount(schema: string): Promise<number>;
  report(schema: string): Promise<ExactlyOnceReport>;
}

const JOBS = 1_000;
const WORKERS = 3;

export function transactionalDrills(target: TransactionalDrillTarget): void {
  const schema = uniqueSchema('txdrill');
  let store: QueueStore;

  beforeAll(async () => {
    store = target.openStore(schema);
    await store.migrate('auto');
    await target.createEffectTable(schema);
  });
  afterEach(() => killAllWorkers());
  afterAll(async () => {
    await store?.close();
    await target.dropSchema(schema);
  });

  let started = 0;
  const startWorker = () =>
    WorkerProcess.start(
      { dialect: target.dialect, url: target.url, schema, workerId: `tx-${++started}`, pauseMs: 20 },
      'transactional-worker.js',
    );

  it(`SIGKILLs at random moments while ${JOBS} jobs and their follow-ups drain: each effect exactly once, with its done job`, async () => {
    for (let from = 0; from < JOBS; from += 500) {
      await store.enqueue(
        Array.from({ length: Math.min(500, JOBS - from) }, (_, n) =>
          prepareJob('tx', { n: from + n }, {}, { maxPayloadBytes: 1024, defaultMaxAttempts: 25 }),
        ),
      );
    }
    // Three workers, one of them killed every 150-400 ms and replaced (a replacement boots in about
    // a second, so two or three run at once): kills land at every point of a handler's transaction,
    // and a worker often dies holding several.
    const workers = await Promise.all(Array.from({ length: WORKERS }, startWorker));
    const booting: Promise<void>[] = [];
    let kills = 0;
    const deadline = Date.now() + 240_000;
    while ((await target.doneCount(schema)) < 2 * JOBS && Date.now() < deadline) {
      await new Promise((resolve) => setTimeout(resolve, 150 + Math.random() * 250));
      const live = workers.filter((worker) => worker.alive);
      if (live.length < 2) continue;
      const victim = live[Math.floor(Math.random() * live.length)]!;
      victim.kill('SIGKILL');
      kills++;
      workers.splice(workers.indexOf(victim), 1);
      booting.push(startWorker().then((worker) => void workers.push(worker)));
    }
    await Promise.all(booting);
    expect(await target.doneCount(schema), 'every job done before the deadline').toBe(2 * JOBS);
    expect(kills).toBeGreaterThanOrEqual(10);

    const report = await target.report(schema);
    expect(report).toMatchObject({
      jobs: 2 * JOBS,
      not_done: 0,
      without_effect: 0,
      with_two: 0,
      stray: 0,
      first_without_child: 0,
      first_with_two: 0,
    });
    // The kills landed inside transactions too: those attempts rolled back and ran again.
    expect(report.reruns).toBeGreaterThan(0);
    if (process.env.SQLQUEUE_DRILL_REPORT) {
      console.info(`transactional drill (${target.dialect}): ${kills} kills, ${report.reruns} jobs ran again`);
    }
  }, 300_000);
}
