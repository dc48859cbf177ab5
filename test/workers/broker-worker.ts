/**
 * A real Nest application consuming one Service Broker queue, run as a child process by the
 * broker crash drill (test/integration/mssql/broker-crash.mssql.spec.ts). Configured by one JSON
 * argument (BrokerWorkerConfig). Talks to the parent over IPC: 'ready', 'started' (a handler
 * began: its message is a leased job of the queue's table queue), 'finished' (the handler is
 * about to return; its completion is recorded after that), and 'event' (broker and job events);
 * each 'started' and 'finished' names the job, its attempt, the conversation and the sequence
 * number. The parent sends 'stop' for a graceful shutdown, or kills the process mid-handler.
 */
import 'reflect-metadata';
import { Injectable, Logger, Module } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ScheduleModule } from '@nestjs/schedule';
import {
  QueueHandler,
  SqlQueueModule,
  type BrokerMessageContext,
  type BrokerMessageHandler,
  type QueueEventListener,
} from '../../lib/src/index.js';
import type { WorkerConfig } from './nest-worker.js';
import { LineLogger, releaseGate, send } from './worker-ipc.js';

/** Configuration of one broker worker (argv[2]); `queue` is the broker queue's name. */
export interface BrokerWorkerConfig extends WorkerConfig {
  dialect: 'mssql';
  /** 'hang': report 'started' and never return (the parent kills the process); 'normal': return. */
  brokerMode: 'hang' | 'normal';
  maxAttempts: number;
  /** Receivers of the queue (default 1..1); minReaders/maxReaders are its handlers (default 1..1). */
  minReceivers?: number;
  maxReceivers?: number;
  leaseMs?: number;
  /** Jobs of one conversation a claim leases together (default: the broker queue's, 10). */
  groupBatchSize?: number;
  waitTimeoutMs?: number;
  pollIntervalMs?: number;
}

const config = JSON.parse(process.argv[2] ?? '{}') as BrokerWorkerConfig;

// Ends an orphaned worker when the parent's channel closes (and takes no 'release' here).
releaseGate();

class BrokerWorkerHandler implements BrokerMessageHandler {
  async handle(body: unknown, context: BrokerMessageContext): Promise<void> {
    const run = {
      jobId: context.jobId,
      attempt: context.attempt,
      conversationHandle: context.conversationHandle,
      sequence: context.messageSequenceNumber,
    };
    send({ type: 'started', ...run, body });
    if (config.brokerMode === 'hang') await new Promise<never>(() => undefined);
    if (config.handlerDelayMs) await new Promise((resolve) => setTimeout(resolve, config.handlerDelayMs));
    send({ type: 'finished', ...run });
  }
}
QueueHandler(config.queue)(BrokerWorkerHandler);
Injectable()(BrokerWorkerHandler);

/** Forwards every broker event to the parent as { type: 'event', name, … }. */
function brokerForwarder(): QueueEventListener {
  const forward =
    (name: string) =>
    (event: object): void =>
      send({ type: 'event', name, ...event });
  return {
    completed: forward('completed'),
    failed: forward('failed'),
    brokerMoved: forward('brokerMoved'),
    brokerReceiversChanged: forward('brokerReceiversChanged'),
    brokerActivated: forward('brokerActivated'),
    brokerNotificationLost: forward('brokerNotificationLost'),
  };
}

@Module({
  imports: [
    ScheduleModule.forRoot(),
    SqlQueueModule.forRoot({
      connection: { dialect: 'mssql', url: config.url, poolSize: 4 },
      schema: config.schema,
      // Leases of a killed worker come back within a second of expiring.
      reaper: { intervalMs: config.reaperIntervalMs ?? 500 },
      consumer: { shutdownTimeoutMs: config.shutdownTimeoutMs ?? 5_000 },
      listeners: config.events ? [brokerForwarder()] : [],
      broker: {
        setup: 'auto',
        waitTimeoutMs: config.waitTimeoutMs ?? 1_000,
        pollIntervalMs: config.pollIntervalMs ?? 1_000,
        queues: {
          [config.queue]: {
            minReceivers: config.minReceivers ?? 1,
            maxReceivers: config.maxReceivers ?? 1,
            minReaders: config.minReaders ?? 1,
            maxReaders: config.maxReaders ?? 1,
            maxAttempts: config.maxAttempts,
            backoff: { type: 'fixed', delayMs: 50 },
            ...(config.leaseMs === undefined ? {} : { leaseMs: config.leaseMs }),
            ...(config.groupBatchSize === undefined ? {} : { groupBatchSize: config.groupBatchSize }),
          },
        },
      },
    }),
  ],
  providers: [BrokerWorkerHandler],
})
class BrokerWorkerModule {}

async function main(): Promise<void> {
  const app = await NestFactory.createApplicationContext(BrokerWorkerModule, { logger: new LineLogger() });
  send({ type: 'ready' });
  process.on('message', (message: { type?: string }) => {
    if (message?.type !== 'stop') return;
    void app.close().then(() => process.exit(0));
  });
}

main().catch((error: Error) => {
  new Logger('broker-worker').error(error.stack ?? error.message);
  send({ type: 'failed', error: error.message });
  process.exit(1);
});
