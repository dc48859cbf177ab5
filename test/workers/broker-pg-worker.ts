/**
 * A process consuming one broker queue on PostgreSQL through the Service Broker double
 * (test/helpers/pg-broker-double.ts): the real receivers and table-queue consumer of
 * test/helpers/broker-engine.ts, plus a lease reaper. Run by the broker crash drill
 * (test/integration/broker-crash.postgres.spec.ts). Every handler run is recorded in the
 * schema's `broker_runs` table as it starts and just before it returns, and its effect goes to an
 * idempotent receiver (`broker_effects`, keyed by conversation and sequence).
 *
 * IPC as the other workers: 'ready', 'started' (a run began), 'finished', 'moving' (a stalled
 * move holds its messages, with stallMoves); the parent kills it.
 */
import pg from 'pg';
import { resolveBrokerOptions } from '../../lib/src/broker/broker.options.js';
import type { BrokerQueueOptions } from '../../lib/src/broker/broker.types.js';
import { createPostgresStore } from '../../lib/src/store/postgres/postgres.connect.js';
import { startBrokerEngine } from '../helpers/broker-engine.js';
import { PgBrokerDouble } from '../helpers/pg-broker-double.js';
import { releaseGate, send } from './worker-ipc.js';

export interface BrokerPgWorkerConfig {
  url: string;
  schema: string;
  queue: string;
  queueOptions: BrokerQueueOptions;
  handlerDelayMs: number;
  reaperIntervalMs: number;
  /** Each move stops after its RECEIVEs, before it enqueues, says 'moving' and waits to be killed. */
  stallMoves?: boolean;
}

const config = JSON.parse(process.argv[2] ?? '{}') as BrokerPgWorkerConfig;
releaseGate();

const records = new pg.Pool({ connectionString: config.url, max: 10 });
records.on('error', () => undefined);

async function main(): Promise<void> {
  const queue = resolveBrokerOptions({ queues: { [config.queue]: config.queueOptions } }, config.schema)!.queues[0]!;
  const store = createPostgresStore({ url: config.url, poolSize: 10 }, { schema: config.schema });
  const double = new PgBrokerDouble({ url: config.url, schema: config.schema, store, queues: [queue] });
  const s = `"${config.schema}"`;
  if (config.stallMoves) {
    double.beforeEnqueue = async (moved) => {
      send({ type: 'moving', moved });
      await new Promise(() => undefined);
    };
  }
  await startBrokerEngine({
    store,
    double,
    queue,
    workerId: `broker-pg-worker:${process.pid}`,
    handler: async (_body, context) => {
      const key = `${context.conversationHandle}#${context.messageSequenceNumber}`;
      const { rows } = await records.query<{ run_id: string }>(
        `INSERT INTO ${s}.broker_runs (conversation, sequence, attempt, pid) VALUES ($1, $2, $3, $4) RETURNING run_id::text`,
        [context.conversationHandle, context.messageSequenceNumber, context.attempt, process.pid],
      );
      send({ type: 'started', jobId: context.jobId, attempt: context.attempt, key });
      await new Promise((resolve) => setTimeout(resolve, config.handlerDelayMs));
      await records.query(`INSERT INTO ${s}.broker_effects (key) VALUES ($1) ON CONFLICT (key) DO NOTHING`, [key]);
      await records.query(`UPDATE ${s}.broker_runs SET ended_at = clock_timestamp() WHERE run_id = $1`, [
        rows[0]!.run_id,
      ]);
      send({ type: 'finished', jobId: context.jobId, key });
    },
  });
  setInterval(() => void store.reap(500).catch(() => undefined), config.reaperIntervalMs);
  send({ type: 'ready' });
}

main().catch((error: Error) => {
  process.stderr.write(`${error.stack ?? error.message}\n`);
  send({ type: 'failed', error: error.message });
  process.exit(1);
});
