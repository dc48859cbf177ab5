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
import { Injectable, Logger, Module, type LoggerService } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ScheduleModule } from '@nestjs/schedule';
import {
  QueueHandler,
  SqlQueueModule,
  type JobContext,
  type QueueEventListener,
  type QueueJobHandler,
} from '../../lib/src/index.js';
import { openEffectsReceiver } from './effects-receiver.js';

/**
 * - 'normal': run, write the effect, return;
 * - 'hang': report 'started' and never return (the test kills or freezes the process);
 * - 'hang-after-effect': write the effect, then hang (a crash after the external action
 *   but before the completion is recorded);
 * - 'gated': report 'started', then wait for a 'release' message from the parent saying
 *   whether to complete (writing the effect first) or to fail.
 */
export type WorkerMode = 'normal' | 'hang' | 'hang-after-effect' | 'gated';

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
}

/** What the parent sends to a 'gated' handler. */
export interface ReleaseMessage {
  type: 'release';
  jobId: string;
  outcome: 'complete' | 'fail';
}

const config = JSON.parse(process.argv[2] ?? '{}') as WorkerConfig;

function send(message: Record<string, unknown>): void {
  // The channel is gone when the parent died; the 'disconnect' handler below ends us then.
  if (process.connected) process.send?.({ pid: process.pid, ...message });
}

/** Logs as JSON lines on stderr, so a failing test can show what the worker saw. */
class LineLogger implements LoggerService {
  private write(level: string, message: unknown): void {
    process.stderr.write(`${JSON.stringify({ pid: process.pid, level, message: String(message) })}\n`);
  }
  log(message: unknown) {
    this.write('log', message);
  }
  warn(message: unknown) {
    this.write('warn', message);
  }
  error(message: unknown) {
    this.write('error', message);
  }
  debug() {}
  verbose() {}
}

const effects = openEffectsReceiver(config.dialect ?? 'postgres', config.url, config.schema);

/** Releases sent by the parent, possibly before the job's handler got there. */
const releases = new Map<string, ReleaseMessage>();
const releaseWaiters = new Map<string, (message: ReleaseMessage) => void>();

function released(jobId: string): Promise<ReleaseMessage> {
  const early = releases.get(jobId);
  if (early) return Promise.resolve(early);
  return new Promise((resolve) => releaseWaiters.set(jobId, resolve));
}

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
  QueueHandler(queue, {
    leaseMs: config.leaseMs ?? 5_000,
    minReaders: config.minReaders ?? 2,
    maxReaders: config.maxReaders ?? 4,
    ...(config.minPollMs ? { minPollMs: config.minPollMs } : {}),
    ...(config.maxPollMs ? { maxPollMs: config.maxPollMs } : {}),
    backoff: { type: 'fixed', delayMs: 50 },
  })(EffectHandler);
  Injectable()(EffectHandler);
  return EffectHandler;
}

/** Forwards every engine event to the parent, so drills can see refusals as they happen. */
function forwardingListener(): QueueEventListener {
  const forward =
    (name: string) =>
    (event: object): void =>
      send({ type: 'event', name, ...event });
  return {
    claimed: forward('claimed'),
    emptyClaim: forward('emptyClaim'),
    completed: forward('completed'),
    failed: forward('failed'),
    lostOwnership: forward('lostOwnership'),
    readersChanged: forward('readersChanged'),
    abandoned: forward('abandoned'),
  };
}

@Module({
  imports: [
    ScheduleModule.forRoot(),
    SqlQueueModule.forRoot({
      connection:
        config.dialect === 'mssql'
          ? { dialect: 'mssql', url: config.url, poolSize: 6 }
          : { dialect: 'postgres', url: config.url, poolSize: 6 },
      schema: config.schema,
      reaper: { intervalMs: config.reaperIntervalMs ?? 500 },
      consumer: {
        shutdownTimeoutMs: config.shutdownTimeoutMs ?? 5_000,
        ...(config.workerId ? { workerId: config.workerId } : {}),
      },
      ...(config.events ? { listeners: [forwardingListener()] } : {}),
    }),
  ],
  providers: [config.queue, ...(config.extraQueues ?? [])].map(handlerFor),
})
class WorkerModule {}

async function main(): Promise<void> {
  // An orphan (the test runner died) must not keep polling the database forever.
  process.on('disconnect', () => process.exit(1));
  process.on('message', (message: { type?: string } | ReleaseMessage) => {
    if (message?.type !== 'release') return;
    const release = message as ReleaseMessage;
    releases.set(release.jobId, release);
    releaseWaiters.get(release.jobId)?.(release);
    releaseWaiters.delete(release.jobId);
  });
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
