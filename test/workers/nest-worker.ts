/**
 * A real Nest application consuming one queue, run as a child process by the cross-process
 * tests and failure drills. Configured by one JSON argument (WorkerConfig). Talks to the
 * parent over IPC: 'ready', 'started' (a job's handler began, after its claim committed),
 * 'finished'; the parent sends 'stop' for a graceful shutdown, or kills the process.
 *
 * Business effects go through an idempotent receiver, as a user would write one: a table
 * keyed by the job's idempotency key, written with ON CONFLICT DO NOTHING. A second table
 * logs every handler start, so tests can tell "ran twice" from "had two effects".
 */
import 'reflect-metadata';
import { Injectable, Logger, Module, type LoggerService } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ScheduleModule } from '@nestjs/schedule';
import pg from 'pg';
import { QueueHandler, SqlQueueModule, type JobContext, type QueueJobHandler } from '../../lib/src/index.js';

/** Configuration of one worker process (passed as JSON in argv[2]). */
export interface WorkerConfig {
  url: string;
  schema: string;
  queue: string;
  leaseMs?: number;
  minReaders?: number;
  maxReaders?: number;
  minPollMs?: number;
  maxPollMs?: number;
  reaperIntervalMs?: number;
  /** How long each handler works before writing its effect. */
  handlerDelayMs?: number;
  /** 'hang': handlers report 'started' and never return (the test kills or freezes the process). */
  mode?: 'normal' | 'hang';
  shutdownTimeoutMs?: number;
}

const config = JSON.parse(process.argv[2] ?? '{}') as WorkerConfig;

function send(message: Record<string, unknown>): void {
  process.send?.({ pid: process.pid, ...message });
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

const effects = new pg.Pool({ connectionString: config.url, max: 4 });
effects.on('error', () => undefined);

@Injectable()
@QueueHandler(config.queue, {
  leaseMs: config.leaseMs ?? 5_000,
  minReaders: config.minReaders ?? 2,
  maxReaders: config.maxReaders ?? 4,
  ...(config.minPollMs ? { minPollMs: config.minPollMs } : {}),
  ...(config.maxPollMs ? { maxPollMs: config.maxPollMs } : {}),
  backoff: { type: 'fixed', delayMs: 50 },
})
class EffectHandler implements QueueJobHandler<{ n: number }> {
  async handle(payload: { n: number }, context: JobContext): Promise<void> {
    await effects.query(`INSERT INTO "${config.schema}".runs (job_id, pid, attempt) VALUES ($1, $2, $3)`, [
      context.jobId,
      process.pid,
      context.attempt,
    ]);
    send({ type: 'started', jobId: context.jobId, attempt: context.attempt, n: payload.n });
    if (config.mode === 'hang') await new Promise(() => undefined);
    if (config.handlerDelayMs) await new Promise((resolve) => setTimeout(resolve, config.handlerDelayMs));
    await effects.query(
      `INSERT INTO "${config.schema}".effects (idempotency_key, job_id, pid) VALUES ($1, $2, $3) ON CONFLICT (idempotency_key) DO NOTHING`,
      [context.idempotencyKey ?? `job-${context.jobId}`, context.jobId, process.pid],
    );
    send({ type: 'finished', jobId: context.jobId });
  }
}

@Module({
  imports: [
    ScheduleModule.forRoot(),
    SqlQueueModule.forRoot({
      connection: { dialect: 'postgres', url: config.url, poolSize: 6 },
      schema: config.schema,
      reaper: { intervalMs: config.reaperIntervalMs ?? 500 },
      consumer: { shutdownTimeoutMs: config.shutdownTimeoutMs ?? 5_000 },
    }),
  ],
  providers: [EffectHandler],
})
class WorkerModule {}

async function main(): Promise<void> {
  const app = await NestFactory.createApplicationContext(WorkerModule, { logger: new LineLogger() });
  send({ type: 'ready' });
  process.on('message', (message: { type?: string }) => {
    if (message?.type !== 'stop') return;
    void app
      .close()
      .then(() => effects.end())
      .then(() => process.exit(0));
  });
}

main().catch((error: Error) => {
  new Logger('worker').error(error.stack ?? error.message);
  send({ type: 'failed', error: error.message });
  process.exit(1);
});
