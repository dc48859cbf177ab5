/**
 * A Nest application whose two queues run transactional handlers (issue 25), as a child process
 * of the exactly-once drill. A job of 'tx' writes one effect row through `context.transaction`
 * and enqueues one follow-up job of 'tx-next' in the same transaction; a job of 'tx-next' writes
 * its own effect row. Effect rows have no unique key: a second commit of one job's work would show
 * as a second row, never as an error. Each handler pauses a few milliseconds between its writes,
 * so the drill's kills land inside transactions as well as around their commits.
 *
 * Configured by one JSON argument (TransactionalWorkerConfig); sends 'ready' over IPC.
 */
import 'reflect-metadata';
import { Injectable, Module } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ScheduleModule } from '@nestjs/schedule';
import sql from 'mssql';
import type pg from 'pg';
import {
  QueueHandler,
  QueueProducer,
  SqlQueueModule,
  type JobContext,
  type QueueJobHandler,
} from '../../lib/src/index.js';
import { LineLogger, send } from './worker-ipc.js';

export interface TransactionalWorkerConfig {
  dialect: 'postgres' | 'mssql';
  url: string;
  schema: string;
  workerId: string;
  /** Longest pause inside a handler, between its writes (ms). */
  pauseMs: number;
}

const config = JSON.parse(process.argv[2] ?? '{}') as TransactionalWorkerConfig;
const pause = () => new Promise((resolve) => setTimeout(resolve, Math.random() * config.pauseMs));

/** One effect row, written in the handler's transaction. */
async function writeEffect(context: JobContext, queue: string): Promise<void> {
  if (config.dialect === 'mssql') {
    await new sql.Request(context.transaction as sql.Transaction)
      .input('jobId', sql.BigInt, context.jobId)
      .input('queue', sql.NVarChar(128), queue)
      .input('pid', sql.Int, process.pid)
      .query(`INSERT INTO [${config.schema}].[TxEffects] ([JobId], [Queue], [Pid]) VALUES (@jobId, @queue, @pid)`);
    return;
  }
  await (context.transaction as pg.ClientBase).query(
    `INSERT INTO "${config.schema}".tx_effects (job_id, queue, pid) VALUES ($1, $2, $3)`,
    [context.jobId, queue, process.pid],
  );
}

const OPTIONS = {
  transactional: true,
  leaseMs: 2_000,
  minReaders: 1,
  maxReaders: 3,
  minPollMs: 20,
  maxPollMs: 200,
  backoff: { type: 'fixed' as const, delayMs: 20 },
};

@Injectable()
@QueueHandler('tx', OPTIONS)
class FirstStep implements QueueJobHandler<{ n: number }> {
  constructor(private readonly producer: QueueProducer) {}

  async handle(payload: { n: number }, context: JobContext): Promise<void> {
    await pause();
    await writeEffect(context, 'tx');
    await pause();
    await this.producer.enqueue(
      'tx-next',
      { parent: context.jobId, n: payload.n },
      { transaction: context.transaction },
    );
    await pause();
  }
}

@Injectable()
@QueueHandler('tx-next', OPTIONS)
class SecondStep implements QueueJobHandler<{ parent: string }> {
  async handle(_payload: { parent: string }, context: JobContext): Promise<void> {
    await pause();
    await writeEffect(context, 'tx-next');
    await pause();
  }
}

@Module({
  imports: [
    ScheduleModule.forRoot(),
    SqlQueueModule.forRoot({
      connection:
        config.dialect === 'mssql'
          ? { dialect: 'mssql', url: config.url, poolSize: 12 }
          : { dialect: 'postgres', url: config.url, poolSize: 12 },
      schema: config.schema,
      reaper: { intervalMs: 250 },
      consumer: { workerId: config.workerId, shutdownTimeoutMs: 2_000 },
    }),
  ],
  providers: [FirstStep, SecondStep],
})
class WorkerModule {}

async function main(): Promise<void> {
  // An orphan (the test runner died) must not keep working on the database.
  process.on('disconnect', () => process.exit(1));
  await NestFactory.createApplicationContext(WorkerModule, { logger: new LineLogger() });
  send({ type: 'ready' });
}

main().catch((error: unknown) => {
  send({ type: 'failed', error: String(error) });
  process.exit(1);
});
