/**
 * A real Nest application consuming one Service Broker queue, run as a child process by the
 * broker crash test (test/integration/mssql/broker-poison.mssql.spec.ts). Configured by one JSON
 * argument (BrokerWorkerConfig). Talks to the parent over IPC: 'ready', 'started' (a handler
 * began: its message's journal row is committed), 'finished', and 'event' (broker events); the
 * parent sends 'stop' for a graceful shutdown, or kills the process mid-handler.
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
  waitTimeoutMs?: number;
  pollIntervalMs?: number;
}

const config = JSON.parse(process.argv[2] ?? '{}') as BrokerWorkerConfig;

// Ends an orphaned worker when the parent's channel closes (and takes no 'release' here).
releaseGate();

class BrokerWorkerHandler implements BrokerMessageHandler {
  async handle(body: unknown, context: BrokerMessageContext): Promise<void> {
    send({
      type: 'started',
      attempt: context.attempt,
      conversationHandle: context.conversationHandle,
      sequence: context.messageSequenceNumber,
      body,
    });
    if (config.brokerMode === 'hang') await new Promise<never>(() => undefined);
    send({ type: 'finished', conversationHandle: context.conversationHandle, sequence: context.messageSequenceNumber });
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
    brokerHandled: forward('brokerHandled'),
    brokerFailed: forward('brokerFailed'),
    brokerDeadLettered: forward('brokerDeadLettered'),
    brokerReadersChanged: forward('brokerReadersChanged'),
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
      consumer: { shutdownTimeoutMs: config.shutdownTimeoutMs ?? 5_000 },
      listeners: config.events ? [brokerForwarder()] : [],
      broker: {
        setup: 'auto',
        waitTimeoutMs: config.waitTimeoutMs ?? 1_000,
        pollIntervalMs: config.pollIntervalMs ?? 1_000,
        queues: {
          [config.queue]: {
            minReaders: config.minReaders ?? 1,
            maxReaders: config.maxReaders ?? 1,
            maxAttempts: config.maxAttempts,
            backoff: { type: 'fixed', delayMs: 50 },
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
