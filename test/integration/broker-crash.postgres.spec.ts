/**
 * The broker crash drill of issue 21, on PostgreSQL: a worker process is SIGKILLed with every
 * handler busy, five times in a row, and a sixth finishes the work. What is proven here is the
 * part shared with the table queue (receivers moving messages into ordered groups, leases, the
 * reaper, the broker job handler), on the Service Broker double; the same drill against a real
 * server (where it also proves the queue stays enabled) is in test/integration/mssql.
 */
import { afterAll, afterEach, beforeAll, expect, it } from 'vitest';
import { encodeBrokerBody } from '../../lib/src/broker/broker.body.js';
import { resolveBrokerOptions } from '../../lib/src/broker/broker.options.js';
import type { BrokerQueueOptions } from '../../lib/src/broker/broker.types.js';
import { PG_URL, sql } from '../helpers/databases.js';
import { PgBrokerDouble } from '../helpers/pg-broker-double.js';
import { migratedPgStore } from '../helpers/pg-store.js';
import { waitFor } from '../helpers/wait-for.js';
import { killAllWorkers, WorkerProcess } from '../helpers/worker-process.js';
import type { BrokerPgWorkerConfig } from '../workers/broker-pg-worker.js';

const db = migratedPgStore('brkcrash', 4);
const QUEUE = 'crashing';
const READERS = 4;
const CONVERSATIONS = 6;
// Enough work (each conversation runs one message at a time, 100 ms each) that a slow machine
// still finds every handler busy at the fifth kill.
const PER_CONVERSATION = 30;
const KILLS = 5;
const queueOptions: BrokerQueueOptions = {
  minReceivers: 2,
  maxReceivers: 2,
  minReaders: READERS,
  maxReaders: READERS,
  leaseMs: 1_500,
  groupBatchSize: 3,
  maxAttempts: 25,
  backoff: { type: 'fixed', delayMs: 50 },
};
let double: PgBrokerDouble;

beforeAll(async () => {
  const queue = resolveBrokerOptions({ queues: { [QUEUE]: queueOptions } }, db.schema)!.queues[0]!;
  double = new PgBrokerDouble({ url: PG_URL, schema: db.schema, store: db.store, queues: [queue] });
  await double.install();
  await sql(
    PG_URL,
    `CREATE TABLE "${db.schema}".broker_runs (
       run_id bigserial PRIMARY KEY, conversation text NOT NULL, sequence bigint NOT NULL, attempt int NOT NULL,
       pid int NOT NULL, started_at timestamptz NOT NULL DEFAULT clock_timestamp(), ended_at timestamptz);
     CREATE TABLE "${db.schema}".broker_effects (key text PRIMARY KEY, at timestamptz NOT NULL DEFAULT clock_timestamp());`,
  );
});
afterEach(() => killAllWorkers());
afterAll(async () => {
  killAllWorkers();
  await double?.close();
});

function worker(stallMoves = false): Promise<WorkerProcess> {
  const config: BrokerPgWorkerConfig = {
    stallMoves,
    url: PG_URL,
    schema: db.schema,
    queue: QUEUE,
    queueOptions,
    handlerDelayMs: 100,
    reaperIntervalMs: 200,
  };
  return WorkerProcess.start(config as never, 'broker-pg-worker.js');
}

it('SIGKILLed inside a move, then five times with every handler busy: every message handled to completion once, each conversation in order, nothing lost', async () => {
  const conversations = Array.from({ length: CONVERSATIONS }, () => double.conversation(QUEUE));
  for (let n = 1; n <= PER_CONVERSATION; n++) {
    for (const c of conversations) await double.send(c, encodeBrokerBody('json', { n }, 1 << 10, 'drill'));
  }
  const total = CONVERSATIONS * PER_CONVERSATION;

  // First a kill inside a move, after its RECEIVEs and before its enqueue: the move's transaction
  // dies with the process, so every message is back in the queue and none became a job.
  const stalled = await worker(true);
  await waitFor(
    () => stalled.messages.filter((m) => m.type === 'moving').length,
    (n) => n >= 1,
    { timeoutMs: 20_000, what: 'a move stalled between its receives and its enqueue' },
  );
  stalled.kill('SIGKILL');
  await stalled.exited;
  await waitFor(
    () => double.waiting(QUEUE),
    (n) => n === total,
    { timeoutMs: 10_000, what: 'every message back in the queue after the killed move' },
  );
  expect((await db.store.stats(QUEUE)).ready).toBe(0);

  for (let kill = 0; kill < KILLS; kill++) {
    const w = await worker();
    // Every handler reader busy at once: as many runs started and not finished as there are readers.
    await waitFor(
      () =>
        w.messages.filter((m) => m.type === 'started').length - w.messages.filter((m) => m.type === 'finished').length,
      (busy) => busy >= READERS,
      { timeoutMs: 20_000, what: `kill ${kill + 1}: every handler of the worker busy` },
    );
    w.kill('SIGKILL');
    await w.exited;
  }

  const last = await worker();
  await waitFor(
    async () =>
      (await sql<{ n: string }>(PG_URL, `SELECT count(*)::text AS n FROM "${db.schema}".broker_effects`))[0]!.n,
    (n) => Number(n) === total,
    { timeoutMs: 60_000, what: 'every effect, after the last worker took over' },
  );
  await waitFor(
    async () => {
      const stats = await db.store.stats(QUEUE);
      return stats.ready + stats.delayed + stats.leased;
    },
    (n) => n === 0,
    { timeoutMs: 20_000, what: 'no job left unfinished' },
  );
  last.kill('SIGKILL');
  await last.exited;

  // Each message became one job, done once (the move is atomic: none moved twice, none lost).
  const jobs = await sql<{ key: string; jobs: string; done: string }>(
    PG_URL,
    `SELECT (payload->>'conversationHandle') || '#' || (payload->>'sequence') AS key,
            count(*)::text AS jobs, count(*) FILTER (WHERE state = 'done')::text AS done
     FROM "${db.schema}".jobs WHERE queue = $1 GROUP BY 1`,
    [QUEUE],
  );
  expect(jobs).toHaveLength(total);
  expect(jobs.filter((j) => j.jobs !== '1' || j.done !== '1')).toEqual([]);
  expect(await double.waiting(QUEUE)).toBe(0);
  expect((await db.store.stats(QUEUE)).dead).toBe(0);

  // The kills cut runs short: some messages ran more than once (at least once, as a lease
  // promises), and their conversation waited for them. In each conversation no run of message
  // k+1 started before the last run of k ended (a group batch starts its next job only once the
  // one before is done in the database), and k+1's job was done after k's.
  const runs = await sql<{ conversation: string; sequence: string; started: Date; ended: Date | null }>(
    PG_URL,
    `SELECT conversation, sequence::text, started_at AS started, ended_at AS ended FROM "${db.schema}".broker_runs`,
  );
  // At least one run cut short per kill (a run whose end was written just before the kill, its
  // 'finished' not yet received, was counted busy).
  expect(runs.filter((r) => r.ended === null).length).toBeGreaterThanOrEqual(KILLS);
  const done = await sql<{ conversation: string; sequence: string; finished: Date }>(
    PG_URL,
    `SELECT payload->>'conversationHandle' AS conversation, payload->>'sequence' AS sequence, finished_at AS finished
     FROM "${db.schema}".jobs WHERE queue = $1`,
    [QUEUE],
  );
  for (const c of conversations) {
    const mine = runs.filter((r) => r.conversation === c.handle);
    const finished = new Map(
      done.filter((d) => d.conversation === c.handle).map((d) => [Number(d.sequence), d.finished]),
    );
    for (let k = 1; k < PER_CONVERSATION; k++) {
      const ends = mine.filter((r) => Number(r.sequence) === k && r.ended !== null).map((r) => r.ended!.getTime());
      const nextStarts = mine.filter((r) => Number(r.sequence) === k + 1).map((r) => r.started.getTime());
      expect(ends.length, `${c.handle} #${k} completed`).toBeGreaterThan(0);
      expect(
        Math.min(...nextStarts),
        `${c.handle}: #${k + 1} started before #${k}'s last run ended`,
      ).toBeGreaterThanOrEqual(Math.max(...ends));
      expect(finished.get(k + 1)!.getTime(), `${c.handle}: #${k + 1} done before #${k}`).toBeGreaterThanOrEqual(
        finished.get(k)!.getTime(),
      );
    }
  }
});
