/**
 * A real Nest application consuming one queue of ordered groups, run as a child process by the
 * group proofs (test/integration/groups-*.postgres.spec.ts). Configured by one JSON argument
 * (GroupWorkerConfig). Every handler run is recorded in the schema's `spans` table (see
 * test/helpers/groups.ts) with its start and its end (just before the handler returns), so that
 * runs of one group in different processes can be compared.
 *
 * Talks to the parent over IPC like nest-worker.ts: 'ready', 'started' and 'finished' (unless
 * `report` is false: a drain of thousands of jobs needs none), 'event' (engine events, when
 * `events` is set); the parent sends 'stop', 'release' (to a 'gated' handler), or kills it.
 */
import 'reflect-metadata';
import { Injectable, Logger, Module } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ScheduleModule } from '@nestjs/schedule';
import pg from 'pg';
import { QueueHandler, SqlQueueModule, type JobContext, type QueueJobHandler } from '../../lib/src/index.js';
import type { WorkerConfig } from './nest-worker.js';
import { LineLogger, releaseGate, send, workerModuleOptions, workerQueueOptions } from './worker-ipc.js';

export interface GroupWorkerConfig extends WorkerConfig {
  groupBatchSize?: number;
  groupOnDead?: 'continue' | 'block';
  /** Send 'started' and 'finished' per job (default true). */
  report?: boolean;
  /**
   * 'each' (default): each run is written as it starts and ends, on the database clock (a
   * killed worker's run shows as started, never ended). 'at-stop': runs are timed by this
   * process's clock and written in one statement at a graceful stop, so that recording costs
   * the drain nothing.
   */
  spans?: 'each' | 'at-stop';
}

const config = JSON.parse(process.argv[2] ?? '{}') as GroupWorkerConfig;

const spans = new pg.Pool({ connectionString: config.url, max: (config.maxReaders ?? 4) + 1 });
spans.on('error', () => undefined);

const released = releaseGate();

/** A handler run, timed by this process's clock (ms since the epoch, sub-millisecond). */
interface Span {
  jobId: string;
  groupKey: string | null;
  attempt: number;
  startedAt: number;
  endedAt: number;
}

const kept: Span[] = [];
/** The wall clock at sub-millisecond resolution (Date.now() would tie runs within one millisecond). */
const now = () => performance.timeOrigin + performance.now();

async function handle(context: JobContext): Promise<void> {
  const atStop = config.spans === 'at-stop';
  const startedAt = now();
  const started = atStop
    ? null
    : await spans.query<{ span_id: string }>(
        `INSERT INTO "${config.schema}".spans (job_id, queue, group_key, pid, attempt) VALUES ($1, $2, $3, $4, $5)
         RETURNING span_id::text`,
        [context.jobId, context.queue, context.groupKey, process.pid, context.attempt],
      );
  const report = config.report !== false;
  if (report) send({ type: 'started', jobId: context.jobId, attempt: context.attempt, groupKey: context.groupKey });
  const mode = config.mode ?? 'normal';
  if (mode === 'hang' || mode === 'hang-after-effect') await new Promise<never>(() => undefined);
  if (mode === 'gated') {
    const release = await released(context.jobId);
    if (release.outcome === 'fail') throw new Error(`job ${context.jobId} fails on request`);
  }
  if (config.handlerDelayMs) await new Promise((resolve) => setTimeout(resolve, config.handlerDelayMs));
  if (started) {
    await spans.query(`UPDATE "${config.schema}".spans SET ended_at = clock_timestamp() WHERE span_id = $1`, [
      started.rows[0]!.span_id,
    ]);
  } else {
    kept.push({
      jobId: context.jobId,
      groupKey: context.groupKey,
      attempt: context.attempt,
      startedAt,
      endedAt: now(),
    });
  }
  if (report) send({ type: 'finished', jobId: context.jobId });
}

/** Writes the spans kept in memory, in one statement. */
async function writeKept(): Promise<void> {
  if (kept.length === 0) return;
  await spans.query(
    `INSERT INTO "${config.schema}".spans (job_id, queue, group_key, pid, attempt, started_at, ended_at)
     SELECT job_id, $1, group_key, $2, attempt, to_timestamp(started_ms / 1000), to_timestamp(ended_ms / 1000)
     FROM unnest($3::bigint[], $4::text[], $5::int[], $6::float8[], $7::float8[])
       AS s(job_id, group_key, attempt, started_ms, ended_ms)`,
    [
      config.queue,
      process.pid,
      kept.map((s) => s.jobId),
      kept.map((s) => s.groupKey),
      kept.map((s) => s.attempt),
      kept.map((s) => s.startedAt),
      kept.map((s) => s.endedAt),
    ],
  );
}

@Injectable()
class GroupHandler implements QueueJobHandler {
  handle(_payload: unknown, context: JobContext): Promise<void> {
    return handle(context);
  }
}
QueueHandler(config.queue, {
  ...workerQueueOptions(config, 1),
  ...(config.groupBatchSize ? { groupBatchSize: config.groupBatchSize } : {}),
  ...(config.groupOnDead ? { groupOnDead: config.groupOnDead } : {}),
})(GroupHandler);

@Module({
  imports: [ScheduleModule.forRoot(), SqlQueueModule.forRoot(workerModuleOptions({ ...config, dialect: 'postgres' }))],
  providers: [GroupHandler],
})
class GroupWorkerModule {}

async function main(): Promise<void> {
  const app = await NestFactory.createApplicationContext(GroupWorkerModule, { logger: new LineLogger() });
  send({ type: 'ready' });
  process.on('message', (message: { type?: string }) => {
    if (message?.type !== 'stop') return;
    void app
      .close()
      .then(() => writeKept())
      .then(() => spans.end())
      .then(
        () => process.exit(0),
        (error: Error) => {
          new Logger('group-worker').error(error.stack ?? error.message);
          process.exit(1);
        },
      );
  });
}

main().catch((error: Error) => {
  new Logger('group-worker').error(error.stack ?? error.message);
  send({ type: 'failed', error: error.message });
  process.exit(1);
});
