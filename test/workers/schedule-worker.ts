/**
 * A real Nest application running recurring jobs, as a child process of the schedules tests:
 * the module's `schedules` option (upserted at boot), the scheduler loop, and one handler per
 * queue that reports each job's schedule tick (`ctx.schedule`) to the parent as
 * { type: 'ticked', jobId, key, scheduleId, tick }. The 'scheduleFired' events are forwarded as
 * { type: 'fired', id, ticks }, so a test can tell what each process fired.
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
  type ScheduleDefinition,
} from '../../lib/src/index.js';
import type { WorkerConfig } from './nest-worker.js';
import { LineLogger, releaseGate, send, workerModuleOptions, workerQueueOptions } from './worker-ipc.js';

/** A worker's configuration (JSON in argv[2]): the queue it consumes and the schedules it declares. */
export interface ScheduleWorkerConfig extends WorkerConfig {
  schedules: Record<string, ScheduleDefinition>;
  /** scheduler.maxPollMs (the idle poll's bound). */
  schedulerMaxPollMs?: number;
}

const config = JSON.parse(process.argv[2] ?? '{}') as ScheduleWorkerConfig;

// Listens for an orphaned worker's disconnect (no handler here is gated).
releaseGate();

function handlerFor(queue: string) {
  class TickHandler implements QueueJobHandler<unknown> {
    handle(_payload: unknown, context: JobContext): Promise<void> {
      send({
        type: 'ticked',
        jobId: context.jobId,
        key: context.idempotencyKey,
        scheduleId: context.schedule?.id ?? null,
        tick: context.schedule?.tick.toISOString() ?? null,
      });
      return Promise.resolve();
    }
  }
  Object.defineProperty(TickHandler, 'name', { value: `TickHandler_${queue}` });
  QueueHandler(queue, workerQueueOptions(config, 1))(TickHandler);
  Injectable()(TickHandler);
  return TickHandler;
}

@Module({
  imports: [
    ScheduleModule.forRoot(),
    SqlQueueModule.forRoot({
      ...workerModuleOptions(config),
      schedules: config.schedules,
      scheduler: { enabled: true, ...(config.schedulerMaxPollMs ? { maxPollMs: config.schedulerMaxPollMs } : {}) },
      listeners: [
        { scheduleFired: (event) => send({ type: 'fired', id: event.id, ticks: event.ticks, skipped: event.skipped }) },
      ],
    }),
  ],
  providers: [config.queue, ...(config.extraQueues ?? [])].map(handlerFor),
})
class ScheduleWorkerModule {}

async function main(): Promise<void> {
  const app = await NestFactory.createApplicationContext(ScheduleWorkerModule, { logger: new LineLogger() });
  send({ type: 'ready' });
  process.on('message', (message: { type?: string }) => {
    if (message?.type !== 'stop') return;
    void app.close().then(() => process.exit(0));
  });
}

main().catch((error: Error) => {
  new Logger('schedule-worker').error(error.stack ?? error.message);
  send({ type: 'failed', error: error.message });
  process.exit(1);
});
