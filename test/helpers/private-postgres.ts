import { spawnSync } from 'node:child_process';
import { chownSync, existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/**
 * A PostgreSQL server of the test's own, for drills that stop and restart the database: the
 * shared server on 5432 serves every other test file in parallel and must never be touched.
 *
 * initdb into a temporary directory, on a free port, with the server binaries found under
 * /usr/lib/postgresql/<version>/bin. PostgreSQL refuses to run as root, so when the tests run
 * as root every server command runs as the `postgres` OS user (runuser). Missing binaries or
 * a missing user fail with a message saying so: a drill that cannot run must not pass.
 */
export class PrivatePostgres {
  private stopped = false;

  private constructor(
    readonly dir: string,
    readonly port: number,
    private readonly bin: string,
    private readonly asUser: string | null,
  ) {
    ALIVE.add(this);
  }

  get dataDir(): string {
    return join(this.dir, 'data');
  }

  get logFile(): string {
    return join(this.dir, 'server.log');
  }

  /** Superuser URL of the default database (trust authentication, local TCP only). */
  get url(): string {
    return `postgres://postgres@127.0.0.1:${this.port}/postgres`;
  }

  static async start(): Promise<PrivatePostgres> {
    const bin = findServerBinaries();
    const asUser = process.getuid?.() === 0 ? 'postgres' : null;
    const owner = asUser ? osUser(asUser) : null;
    const dir = mkdtempSync(join(tmpdir(), 'sqlqueue-pg-'));
    try {
      if (owner) chownSync(dir, owner.uid, owner.gid);
      const port = await freePort();
      const server = new PrivatePostgres(dir, port, bin, asUser);
      // --no-sync and fsync=off: a process crash loses nothing (the OS keeps the pages), and
      // the drills crash processes, not the machine. synchronous_commit stays on: a commit the
      // client saw must survive an immediate shutdown.
      server.run('initdb', ['-D', server.dataDir, '-U', 'postgres', '-A', 'trust', '-E', 'UTF8', '--no-sync']);
      server.startServer();
      return server;
    } catch (error) {
      rmSync(dir, { recursive: true, force: true });
      throw error;
    }
  }

  /** Stops the server: 'immediate' is a crash (recovery on next start), 'fast' a clean stop. */
  stopServer(mode: 'immediate' | 'fast' = 'immediate'): void {
    this.run('pg_ctl', ['-D', this.dataDir, '-m', mode, '-w', '-t', '30', 'stop']);
  }

  startServer(): void {
    const options = [
      `-p ${this.port}`,
      `-k ${this.dir}`,
      '-c listen_addresses=127.0.0.1',
      '-c fsync=off',
      '-c full_page_writes=off',
      '-c max_connections=200',
    ].join(' ');
    this.run('pg_ctl', ['-D', this.dataDir, '-l', this.logFile, '-o', options, '-w', '-t', '60', 'start']);
  }

  /** Stops the server if it runs and deletes its directory; safe to call twice. */
  destroy(): void {
    if (this.stopped) return;
    this.stopped = true;
    ALIVE.delete(this);
    if (existsSync(join(this.dataDir, 'postmaster.pid'))) {
      spawnSync(...this.command('pg_ctl', ['-D', this.dataDir, '-m', 'immediate', '-w', '-t', '30', 'stop']), {
        stdio: 'ignore',
      });
    }
    rmSync(this.dir, { recursive: true, force: true });
  }

  /** The server's own log, for failure messages. */
  serverLog(): string {
    try {
      return readFileSync(this.logFile, 'utf8');
    } catch {
      return '(no server log)';
    }
  }

  private command(tool: string, args: string[]): [string, string[]] {
    const path = join(this.bin, tool);
    return this.asUser ? ['runuser', ['-u', this.asUser, '--', path, ...args]] : [path, args];
  }

  private run(tool: string, args: string[]): void {
    const [command, argv] = this.command(tool, args);
    const result = spawnSync(command, argv, { encoding: 'utf8', timeout: 90_000 });
    if (result.status !== 0) {
      throw new Error(
        `${tool} ${args.join(' ')} failed (${result.error?.message ?? `exit ${result.status}`}):\n${result.stdout}\n${result.stderr}\n${this.serverLog()}`,
      );
    }
  }
}

/** Servers still running, stopped when the test process exits even if afterAll never ran. */
const ALIVE = new Set<PrivatePostgres>();
process.on('exit', () => {
  for (const server of ALIVE) server.destroy();
});

function findServerBinaries(): string {
  const root = '/usr/lib/postgresql';
  const versions = existsSync(root)
    ? readdirSync(root)
        .filter((v) => /^\d+(\.\d+)?$/.test(v) && existsSync(join(root, v, 'bin', 'initdb')))
        .sort((a, b) => Number(b) - Number(a))
    : [];
  if (versions.length === 0) {
    throw new Error(
      `this drill starts a private PostgreSQL server and needs its binaries (initdb, pg_ctl) under ${root}/<version>/bin, found none: install the PostgreSQL server package (e.g. apt-get install postgresql)`,
    );
  }
  return join(root, versions[0]!, 'bin');
}

function osUser(name: string): { uid: number; gid: number } {
  const result = spawnSync('id', ['-u', name], { encoding: 'utf8' });
  const group = spawnSync('id', ['-g', name], { encoding: 'utf8' });
  if (result.status !== 0 || group.status !== 0) {
    throw new Error(
      `this drill runs a private PostgreSQL server, which refuses to run as root, as the '${name}' OS user, and there is no such user: create it (useradd ${name}) or run the tests as a non-root user`,
    );
  }
  if (spawnSync('runuser', ['--help'], { stdio: 'ignore' }).error) {
    throw new Error('this drill needs runuser (util-linux) to start a private PostgreSQL server as the postgres user');
  }
  return { uid: Number(result.stdout.trim()), gid: Number(group.stdout.trim()) };
}

/** A local TCP port nobody listens on (free a moment ago). */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as net.AddressInfo;
      server.close(() => resolve(port));
    });
  });
}
