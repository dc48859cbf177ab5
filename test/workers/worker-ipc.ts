/**
 * What the worker processes (nest-worker.ts, group-worker.ts) share: messages to the parent,
 * a JSON-lines logger, 'release' messages for gated handlers, forwarded engine events, and the
 * queue and module options every worker builds from its configuration.
 */
import type { LoggerService } from '@nestjs/common';
import type { QueueEventListener, QueueOptions, SqlQueueModuleOptions } from '../../lib/src/index.js';
import type { ReleaseMessage, WorkerConfig } from './nest-worker.js';

export function send(message: Record<string, unknown>): void {
  // The channel is gone when the parent died; the 'disconnect' handler in main() ends us then.
  if (process.connected) process.send?.({ pid: process.pid, ...message });
}

/** Logs as JSON lines on stderr, so a failing test can show what the worker saw. */
export class LineLogger implements LoggerService {
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

/**
 * Listens for the parent's 'release' messages (and ends an orphaned worker); returns how a gated
 * handler waits for its job's release, which may have arrived before the handler got there.
 */
export function releaseGate(): (jobId: string) => Promise<ReleaseMessage> {
  const releases = new Map<string, ReleaseMessage>();
  const waiters = new Map<string, (message: ReleaseMessage) => void>();
  // An orphan (the test runner died) must not keep polling the database forever.
  process.on('disconnect', () => process.exit(1));
  process.on('message', (message: { type?: string } | ReleaseMessage) => {
    if (message?.type !== 'release') return;
    const release = message as ReleaseMessage;
    releases.set(release.jobId, release);
    waiters.get(release.jobId)?.(release);
    waiters.delete(release.jobId);
  });
  return (jobId) => {
    const early = releases.get(jobId);
    if (early) return Promise.resolve(early);
    return new Promise((resolve) => waiters.set(jobId, resolve));
  };
}

/** Forwards every engine event to the parent as { type: 'event', name, … }. */
export function forwardingListener(): QueueEventListener {
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
    canceled: forward('canceled'),
  };
}

/** The handler options a worker's configuration asks for (short lease, fixed 50 ms backoff). */
export function workerQueueOptions(config: WorkerConfig, defaultMinReaders: number): QueueOptions {
  return {
    leaseMs: config.leaseMs ?? 5_000,
    minReaders: config.minReaders ?? defaultMinReaders,
    maxReaders: config.maxReaders ?? 4,
    ...(config.minPollMs ? { minPollMs: config.minPollMs } : {}),
    ...(config.maxPollMs ? { maxPollMs: config.maxPollMs } : {}),
    backoff: { type: 'fixed', delayMs: 50 },
    ...config.queueOptions,
  };
}

/** The module options of a worker: its database, a fast reaper, its shutdown bound and events. */
export function workerModuleOptions(config: WorkerConfig): SqlQueueModuleOptions {
  return {
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
  };
}
