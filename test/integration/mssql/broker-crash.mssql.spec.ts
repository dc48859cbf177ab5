/**
 * The Service Broker crash drill (issue 21, "Done means"; review 2, R2-4), on both databases:
 * a worker process consuming a broker queue with 4 handler readers and 2 receivers is SIGKILLed
 * while every handler reader is busy, five times in a row, a new worker starting after each,
 * while the parent keeps sending over 8 conversations. Each kill drops the worker's connections,
 * so SQL Server rolls back whatever they had open (a move in flight: a rolled-back RECEIVE), and
 * its leases come back through the next worker's reaper. At the end:
 * - the queue is still receive-enabled (POISON_MESSAGE_HANDLING OFF: rollbacks never disable it);
 * - every message became exactly one job, done: one row per (conversation, sequence), nothing
 *   lost, nothing dead or unfinished, nothing left in the Service Broker queue;
 * - each conversation completed in sequence order: no run of message k+1 started before the run
 *   of message k that completed had ended (from the workers' 'started'/'finished' messages);
 * - every handler a kill interrupted ran again in a later worker.
 */
import { afterEach, expect, it } from 'vitest';
import { waitFor } from '../../helpers/wait-for.js';
import { killAllWorkers, WorkerProcess, type WorkerMessage } from '../../helpers/worker-process.js';
import type { BrokerWorkerConfig } from '../../workers/broker-worker.js';
import { brokerSuite } from './broker-harness.js';
import { describeEachMssqlDatabase } from './mssql-databases.js';

const KEYS = 8;
const PER_KEY = 60;
const READERS = 4;
const KILLS = 5;
/** A worker finishes this many handlers before it may be killed, so each one does real work. */
const FINISHED_BEFORE_KILL = 10;

interface Keyed {
  key: string;
  n: number;
}

/** A 'started' or 'finished' message of a worker, in the one order they happened in (see `order`). */
interface Run {
  type: 'started' | 'finished';
  /** Position over all workers: worker by worker (each died before the next began), message by message. */
  order: number;
  worker: number;
  jobId: string;
  attempt: number;
  conversation: string;
  sequence: bigint;
}

/**
 * Kills `worker` with SIGKILL in the turn its handlers are all busy (`readers` started and not
 * finished) once it has finished `minFinished`; resolves with the jobs whose handlers it cut off.
 */
function killWhenBusy(worker: WorkerProcess, readers: number, minFinished: number, timeoutMs = 90_000) {
  return new Promise<string[]>((resolve, reject) => {
    const inFlight = new Set<string>();
    let finished = 0;
    let done = false;
    const settle = (outcome: () => void) => {
      done = true;
      clearTimeout(timer);
      worker.child.off('message', watch);
      outcome();
    };
    const watch = (m: WorkerMessage) => {
      if (done) return;
      if (m.type === 'started') inFlight.add(String(m.jobId));
      if (m.type === 'finished') {
        inFlight.delete(String(m.jobId));
        finished++;
      }
      if (inFlight.size === readers && finished >= minFinished) {
        // In the same turn as the message that made them all busy: none could have finished since.
        worker.kill('SIGKILL');
        settle(() => resolve([...inFlight]));
      }
    };
    const timer = setTimeout(
      () =>
        settle(() =>
          reject(
            new Error(
              `worker ${worker.pid}: never had ${readers} handlers busy after ${minFinished} finished (${inFlight.size} busy, ${finished} finished)\n${worker.log}`,
            ),
          ),
        ),
      timeoutMs,
    );
    // Messages that arrived before this was called (the worker's handlers may start during its boot).
    for (const m of [...worker.messages]) watch(m);
    if (!done) worker.child.on('message', watch);
  });
}

describeEachMssqlDatabase('Service Broker crash drill: workers SIGKILLed with every handler busy', (db) => {
  const suite = brokerSuite(db, 'brkcrash');
  afterEach(() => killAllWorkers());

  it('five SIGKILLs in a row with every handler reader busy: the queue stays enabled, every message runs to completion exactly once, in its conversation order, nothing lost', async () => {
    const name = 'drill';
    const queue = suite.queue(name).queue;
    const total = KEYS * PER_KEY;
    // The parent only sends (a producer-only application); the workers consume.
    const sender = await suite.boot({ queues: { [name]: {} }, module: { consumer: { enabled: false } } });
    const send = (k: number, n: number) => sender.producer.send(name, { key: `k${k}`, n }, { groupKey: `k${k}` });
    const keys = Array.from({ length: KEYS }, (_, k) => k);
    // A backlog, so that every handler reader has work at once; the rest while workers die.
    const half = PER_KEY / 2;
    await Promise.all(
      keys.map(async (k) => {
        for (let n = 0; n < half; n++) await send(k, n);
      }),
    );
    const sending = Promise.all(
      keys.map(async (k) => {
        for (let n = half; n < PER_KEY; n++) {
          await send(k, n);
          // Paced, so that sends (and the moves they cause) span several kills.
          await new Promise((resolve) => setTimeout(resolve, 250));
        }
      }),
    );

    const config: BrokerWorkerConfig = {
      dialect: 'mssql',
      url: db.url,
      schema: suite.schema,
      queue: name,
      brokerMode: 'normal',
      // Kills cost attempts (an interrupted run, a reaped lease): never enough to make a job dead.
      maxAttempts: 50,
      minReaders: READERS,
      maxReaders: READERS,
      minReceivers: 2,
      maxReceivers: 2,
      leaseMs: 3_000,
      handlerDelayMs: 50,
      reaperIntervalMs: 500,
    };
    const workers: WorkerProcess[] = [];
    const kills: { worker: number; cutOff: string[] }[] = [];
    for (let round = 0; round < KILLS; round++) {
      const worker = await WorkerProcess.start(config, 'broker-worker.js');
      workers.push(worker);
      const cutOff = await killWhenBusy(worker, READERS, FINISHED_BEFORE_KILL);
      kills.push({ worker: workers.length - 1, cutOff });
      await worker.exited;
    }
    const last = await WorkerProcess.start(config, 'broker-worker.js');
    workers.push(last);
    await sending;
    await waitFor(
      () => suite.jobStates(name),
      (states) => states.done === total && Object.keys(states).length === 1,
      { timeoutMs: 120_000, intervalMs: 250, what: `${total} jobs, all done` },
    );
    await waitFor(
      () => suite.messagesIn(queue),
      (n) => n === 0,
      { what: 'nothing left in the Service Broker queue' },
    );
    await last.stop();

    // Soft: every broken expectation of the drill is reported, not only the first.
    expect
      .soft(
        kills.map((k) => k.cutOff.length),
        'handlers busy at each kill',
      )
      .toEqual(Array(KILLS).fill(READERS));
    expect.soft(await suite.queueStatus(queue), 'the queue after five kills').toEqual({
      ReceiveEnabled: 1,
      EnqueueEnabled: 1,
      PoisonHandling: 0,
    });
    expect
      .soft(await suite.jobStates(name), 'jobs by state: all done, none dead or unfinished')
      .toEqual({ done: total });
    expect.soft(await suite.messagesIn(queue), 'messages left in the Service Broker queue').toBe(0);

    // Exactly once, nothing lost: one job per received message, done, and each body sent once.
    const jobs = await suite.jobsByMessage(name);
    expect
      .soft(
        jobs
          .filter((j) => Number(j.Jobs) !== 1 || Number(j.Done) !== 1)
          .map((j) => `${j.ConversationHandle} #${j.Sequence}: ${j.Jobs} jobs, ${j.Done} done`),
        'messages moved more than once or not done',
      )
      .toEqual([]);
    const bodies = jobs.map((j) => JSON.parse(j.Text ?? 'null') as Keyed | null);
    const byKey = new Map<string, { conversations: Set<string>; ns: number[] }>();
    jobs.forEach((job, i) => {
      const body = bodies[i];
      if (!body) return;
      const entry = byKey.get(body.key) ?? { conversations: new Set<string>(), ns: [] };
      entry.conversations.add(job.ConversationHandle);
      entry.ns.push(body.n); // jobs are ordered by conversation, then sequence number
      byKey.set(body.key, entry);
    });
    expect.soft(bodies.filter((b) => b === null).length, 'jobs without a JSON body').toBe(0);
    expect.soft(jobs.length, 'jobs (one per message sent)').toBe(total);
    for (const k of keys) {
      const entry = byKey.get(`k${k}`);
      expect.soft(entry?.conversations.size, `k${k}: one conversation`).toBe(1);
      // In sequence order, the bodies of a key are its sends in order: none lost, none twice.
      expect.soft(entry?.ns, `k${k}: bodies in sequence order`).toEqual(Array.from({ length: PER_KEY }, (_, n) => n));
    }

    // The runs, in the order they happened.
    let order = 0;
    const runs: Run[] = workers.flatMap((worker, w) =>
      worker.messages
        .filter((m) => m.type === 'started' || m.type === 'finished')
        .map((m) => ({
          type: m.type as Run['type'],
          order: order++,
          worker: w,
          jobId: String(m.jobId),
          attempt: Number(m.attempt),
          conversation: String(m.conversationHandle),
          sequence: BigInt(String(m.sequence)),
        })),
    );
    const byConversation = new Map<string, Map<bigint, Run[]>>();
    for (const run of runs) {
      const messages = byConversation.get(run.conversation) ?? new Map<bigint, Run[]>();
      messages.set(run.sequence, [...(messages.get(run.sequence) ?? []), run]);
      byConversation.set(run.conversation, messages);
    }
    const unfinished: string[] = [];
    const outOfOrder: string[] = [];
    for (const [conversation, messages] of byConversation) {
      const sequences = [...messages.keys()].sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
      for (const [i, sequence] of sequences.entries()) {
        // The run that completed is the last that finished: a job done is never claimed again,
        // and a run that finished but whose completion a kill lost is followed by another.
        const lastFinished = messages
          .get(sequence)!
          .filter((r) => r.type === 'finished')
          .at(-1);
        if (!lastFinished) {
          unfinished.push(`${conversation} #${sequence}`);
          continue;
        }
        const next = sequences[i + 1];
        if (next === undefined) continue;
        for (const early of messages.get(next)!.filter((r) => r.type === 'started' && r.order < lastFinished.order)) {
          const sameWorker = early.worker === lastFinished.worker ? 'the same worker' : `worker ${early.worker}`;
          outOfOrder.push(
            `${conversation}: #${next} (job ${early.jobId}, attempt ${early.attempt}) started in ${sameWorker} before #${sequence}'s completed run (job ${lastFinished.jobId}, attempt ${lastFinished.attempt}, worker ${lastFinished.worker}) ended`,
          );
        }
      }
    }
    expect.soft(byConversation.size, 'conversations handled').toBe(KEYS);
    expect.soft(unfinished, 'messages whose handler never finished').toEqual([]);
    expect
      .soft(
        outOfOrder,
        // A group batch runs message k+1 as soon as k's completion is queued, before it is
        // committed (core/consumer/queue-consumer.ts runBatch, core/consumer/job-acker.ts): a kill in between
        // brings k back after k+1 ran.
        'runs of a message that started before the completed run of the message before it ended',
      )
      .toEqual([]);

    // Every interrupted handler ran again in a later worker.
    for (const { worker, cutOff } of kills) {
      for (const jobId of cutOff) {
        expect
          .soft(
            runs.some((r) => r.type === 'finished' && r.jobId === jobId && r.worker > worker),
            `job ${jobId}, cut off by kill of worker ${worker}, finished in a later worker`,
          )
          .toBe(true);
      }
    }
    const started = runs.filter((r) => r.type === 'started').length;
    expect.soft(started, 'handler runs started (the kills made some run again)').toBeGreaterThan(total);
  }, 300_000);
});
