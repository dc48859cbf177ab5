import { fork, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import type { WorkerConfig } from '../workers/nest-worker.js';
import type { TransactionalWorkerConfig } from '../workers/transactional-worker.js';

const BUILD = fileURLToPath(new URL('../../dist/test-build/test/workers/', import.meta.url));

export interface WorkerMessage {
  type: string;
  pid: number;
  jobId?: string;
  attempt?: number;
  [key: string]: unknown;
}

/** A worker child process (see test/workers/nest-worker.ts), compiled by the global setup. */
export class WorkerProcess {
  readonly messages: WorkerMessage[] = [];
  readonly stderr: string[] = [];
  /** Messages some `next()` already returned; the others stay available to a later `next()`. */
  private readonly taken = new WeakSet<WorkerMessage>();
  private readonly waiters: { match: (m: WorkerMessage) => boolean; resolve: (m: WorkerMessage) => void }[] = [];
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;

  private constructor(readonly child: ChildProcess) {
    child.on('message', (message: WorkerMessage) => {
      this.messages.push(message);
      for (const waiter of [...this.waiters]) {
        if (waiter.match(message)) {
          this.waiters.splice(this.waiters.indexOf(waiter), 1);
          this.taken.add(message);
          waiter.resolve(message);
        }
      }
    });
    child.stderr?.setEncoding('utf8').on('data', (chunk: string) => this.stderr.push(chunk));
    this.exited = new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })));
    LIVE.add(this);
    void this.exited.then(() => LIVE.delete(this));
  }

  /** `config` is the script's own (WorkerConfig for nest-worker.js, the default). */
  static async start(
    config: WorkerConfig | TransactionalWorkerConfig,
    script = 'nest-worker.js',
  ): Promise<WorkerProcess> {
    const child = fork(`${BUILD}${script}`, [JSON.stringify(config)], { stdio: ['ignore', 'ignore', 'pipe', 'ipc'] });
    const worker = new WorkerProcess(child);
    const ready = await Promise.race([
      worker.next((m) => m.type === 'ready' || m.type === 'failed'),
      worker.exited.then(() => ({ type: 'exited', pid: child.pid ?? 0 }) as WorkerMessage),
    ]);
    if (ready.type !== 'ready') {
      throw new Error(`worker did not start (${ready.type}): ${worker.stderr.join('')}`);
    }
    return worker;
  }

  get pid(): number {
    return this.child.pid!;
  }

  /** The next message matching `match` (including one already received but not yet taken). */
  next(match: (m: WorkerMessage) => boolean, timeoutMs = 30_000): Promise<WorkerMessage> {
    // Several messages can arrive in one read of the IPC channel, before the caller gets to ask.
    const early = this.messages.find((m) => !this.taken.has(m) && match(m));
    if (early) {
      this.taken.add(early);
      return Promise.resolve(early);
    }
    return new Promise((resolve, reject) => {
      const timer = setTimeout(
        () =>
          reject(
            new Error(`worker ${this.child.pid}: no matching message in ${timeoutMs} ms\n${this.stderr.join('')}`),
          ),
        timeoutMs,
      );
      this.waiters.push({
        match,
        resolve: (m) => {
          clearTimeout(timer);
          resolve(m);
        },
      });
    });
  }

  /** The next engine event `name` (forwarded when the worker runs with `events: true`). */
  event(name: string, match: (m: WorkerMessage) => boolean = () => true, timeoutMs = 30_000): Promise<WorkerMessage> {
    return this.next((m) => m.type === 'event' && m.name === name && match(m), timeoutMs);
  }

  /** Messages received so far of one type (and engine event name, for 'event'). */
  received(type: string, name?: string): WorkerMessage[] {
    return this.messages.filter((m) => m.type === type && (name === undefined || m.name === name));
  }

  /** Lets a job of a 'gated' worker finish: complete (after writing its effect) or fail. */
  release(jobId: string, outcome: 'complete' | 'fail'): void {
    this.child.send({ type: 'release', jobId, outcome });
  }

  /** Everything the worker logged (JSON lines on stderr), as one string. */
  get log(): string {
    return this.stderr.join('');
  }

  get alive(): boolean {
    return this.child.exitCode === null && this.child.signalCode === null;
  }

  kill(signal: NodeJS.Signals = 'SIGKILL'): void {
    this.child.kill(signal);
  }

  /** Graceful: the worker closes its Nest application (draining handlers) and exits. */
  async stop(timeoutMs = 20_000): Promise<void> {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return;
    this.child.send({ type: 'stop' });
    const timer = setTimeout(() => this.kill(), timeoutMs);
    await this.exited;
    clearTimeout(timer);
  }
}

/** Every worker still alive; killed when the test process exits, so CI never hangs on orphans. */
const LIVE = new Set<WorkerProcess>();
process.on('exit', () => {
  for (const worker of LIVE) worker.child.kill('SIGKILL');
});

export async function killAllWorkers(): Promise<void> {
  const live = [...LIVE];
  for (const worker of live) {
    // A frozen (SIGSTOPped) process must be resumed for it to die in an orderly way.
    worker.child.kill('SIGCONT');
    worker.child.kill('SIGKILL');
  }
  await Promise.all(live.map((worker) => worker.exited));
}

/** Creates the tables the worker's idempotent receiver writes to. */
export async function createEffectTables(url: string, schema: string): Promise<void> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    await client.query(`CREATE SCHEMA IF NOT EXISTS "${schema}"`);
    await client.query(
      `CREATE TABLE IF NOT EXISTS "${schema}".effects (idempotency_key text PRIMARY KEY, job_id bigint NOT NULL, pid int NOT NULL, at timestamptz NOT NULL DEFAULT now())`,
    );
    await client.query(
      `CREATE TABLE IF NOT EXISTS "${schema}".runs (job_id bigint NOT NULL, pid int NOT NULL, attempt int NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())`,
    );
    // Every attempt to write an effect, and whether the receiver applied it or refused a repeat.
    await client.query(
      `CREATE TABLE IF NOT EXISTS "${schema}".effect_writes (idempotency_key text NOT NULL, job_id bigint NOT NULL, pid int NOT NULL, attempt int NOT NULL, applied boolean NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())`,
    );
  } finally {
    await client.end();
  }
}
