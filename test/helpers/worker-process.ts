import { fork, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import type { WorkerConfig } from '../workers/nest-worker.js';

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
  private readonly waiters: { match: (m: WorkerMessage) => boolean; resolve: (m: WorkerMessage) => void }[] = [];
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;

  private constructor(readonly child: ChildProcess) {
    child.on('message', (message: WorkerMessage) => {
      this.messages.push(message);
      for (const waiter of [...this.waiters]) {
        if (waiter.match(message)) {
          this.waiters.splice(this.waiters.indexOf(waiter), 1);
          waiter.resolve(message);
        }
      }
    });
    child.stderr?.setEncoding('utf8').on('data', (chunk: string) => this.stderr.push(chunk));
    this.exited = new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })));
    LIVE.add(this);
    void this.exited.then(() => LIVE.delete(this));
  }

  static async start(config: WorkerConfig, script = 'nest-worker.js'): Promise<WorkerProcess> {
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
  } finally {
    await client.end();
  }
}
