/**
 * A real Nest application consuming one queue (or a few), run as a child process by the
 * cross-process tests and failure drills. Configured by one JSON argument (WorkerConfig).
 * Talks to the parent over IPC: 'ready', 'started' (a job's handler began, after its claim
 * committed), 'effected' (the business effect was written, or found already written),
 * 'finished', and 'event' (engine events, when `events` is set); the parent sends 'stop' for a
 * graceful shutdown, 'release' to let a gated handler finish, or kills the process.
 *
 * Business effects go through an idempotent receiver, as a user would write one: a table
 * keyed by the job's idempotency key, written at most once per key. A second table logs every
 * handler start, so tests can tell "ran twice" from "had two effects", and a third logs every
 * attempt to write the effect (committed with the effect itself), so a drill can show the
 * receiver refusing a repeat. See effects-receiver.ts; the queue and the receiver are on
 * PostgreSQL or on SQL Server (`dialect`).
 */
import 'reflect-metadata';
import { Injectable, Logger, Module } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ScheduleModule } from '@nestjs/schedule';
import {
  QueueHandler,
  SqlQueueModule,
  type JobContext,
  type QueueJobHandler,
  type QueueOptions,
} from '../../lib/src/index.js';
import { openEffectsReceiver } from './effects-receiver.js';
import { LineLogger, releaseGate, send, workerModuleOptions, workerQueueOptions } from './worker-ipc.js';

/**
 * - 'normal': run, write the effect, return;
 * - 'hang': report 'started' and never return (the test kills or freezes the process);
 * - 'hang-after-effect': write the effect, then hang (a crash after the external action
 *   but before the completion is recorded);
 * - 'gated': report 'started', then wait for a 'release' message from the parent saying
 *   whether to complete (writing the effect first) or to fail;
 * - 'progress': report progress ({ step: 1 }, { step: 2 }, …) every 100 ms until the job's
 *   signal aborts (a cancel), then throw its reason.
 */
export type WorkerMode = 'normal' | 'hang' | 'hang-after-effect' | 'gated' | 'progress';

/** Configuration of one worker process (passed as JSON in argv[2]). */
export interface WorkerConfig {
  /** Where the queue and the receiver live (default postgres). */
  dialect?: 'postgres' | 'mssql';
  url: string;
  schema: string;
  queue: string;
  /** More queues consumed by the same handler logic in this process. */
  extraQueues?: string[];
  leaseMs?: number;
  minReaders?: number;
  maxReaders?: number;
  minPollMs?: number;
  maxPollMs?: number;
  reaperIntervalMs?: number;
  /** How long each handler works before writing its effect. */
  handlerDelayMs?: number;
  mode?: WorkerMode;
  shutdownTimeoutMs?: number;
  /** consumer.workerId: lets a test recognise this process in job rows and attempt history. */
  workerId?: string;
  /** Forward engine events (QueueEventListener) to the parent as { type: 'event', name, … }. */
  events?: boolean;
  /** More queue options (flow limits, …), over the ones above. */
  queueOptions?: QueueOptions;
}

/** What the parent sends to a 'gated' handler. */
export interface ReleaseMessage {
  type: 'release';
  jobId: string;
  outcome: 'complete' | 'fail';
}

const config = JSON.parse(process.argv[2] ?? '{}') as WorkerConfig;

const effects = openEffectsReceiver(config.dialect ?? 'postgres', config.url, config.schema);

const released = releaseGate();

const hangForever = () => new Promise<never>(() => undefined);

async function writeEffect(context: JobContext): Promise<boolean> {
  const key = context.idempotencyKey ?? `job-${context.jobId}`;
  const applied = await effects.writeEffect(key, context.jobId, process.pid, context.attempt);
  send({ type: 'effected', jobId: context.jobId, applied });
  return applied;
}

async function handle(payload: { n: number }, context: JobContext): Promise<void> {
  await effects.recordRun(context.jobId, process.pid, context.attempt);
  send({ type: 'started', jobId: context.jobId, attempt: context.attempt, n: payload.n, queue: context.queue });
  const mode = config.mode ?? 'normal';
  if (mode === 'hang') await hangForever();
  if (mode === 'progress') {
    for (let step = 1; !context.signal.aborted; step++) {
      context.progress({ step });
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    throw context.signal.reason;
  }
  if (mode === 'gated') {
    const release = await released(context.jobId);
    if (release.outcome === 'fail') throw new Error(`drill: job ${context.jobId} fails on request`);
  }
  if (config.handlerDelayMs) await new Promise((resolve) => setTimeout(resolve, config.handlerDelayMs));
  await writeEffect(context);
  if (mode === 'hang-after-effect') await hangForever();
  send({ type: 'finished', jobId: context.jobId });
}

/** One handler class per queue: the library allows one handler per queue per application. */
function handlerFor(queue: string) {
  class EffectHandler implements QueueJobHandler<{ n: number }> {
    handle(payload: { n: number }, context: JobContext): Promise<void> {
      return handle(payload, context);
    }
  }
  Object.defineProperty(EffectHandler, 'name', { value: `EffectHandler_${queue}` });
  QueueHandler(queue, workerQueueOptions(config, 2))(EffectHandler);
  Injectable()(EffectHandler);
  return EffectHandler;
}

@Module({
  imports: [ScheduleModule.forRoot(), SqlQueueModule.forRoot(workerModuleOptions(config))],
  providers: [config.queue, ...(config.extraQueues ?? [])].map(handlerFor),
})
class WorkerModule {}

async function main(): Promise<void> {
  const app = await NestFactory.createApplicationContext(WorkerModule, { logger: new LineLogger() });
  send({ type: 'ready' });
  process.on('message', (message: { type?: string }) => {
    if (message?.type !== 'stop') return;
    void app
      .close()
      .then(() => effects.close())
      .then(() => process.exit(0));
  });
}

main().catch((error: Error) => {
  new Logger('worker').error(error.stack ?? error.message);
  send({ type: 'failed', error: error.message });
  process.exit(1);
});
