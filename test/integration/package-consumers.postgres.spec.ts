import { spawn, spawnSync } from 'node:child_process';
import {
  cpSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  existsSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import * as dashboardApi from '../../lib/src/dashboard.js';
import * as healthApi from '../../lib/src/health.js';
import * as mainApi from '../../lib/src/index.js';
import * as prometheusApi from '../../lib/src/prometheus.js';
import { dropPgSchema, PG_URL, uniqueSchema } from '../helpers/databases.js';

/**
 * The package as users get it: built with tsc, packed with npm pack, installed into a scratch
 * CommonJS app and a scratch ESM app (no network: the tarball is extracted into node_modules,
 * peers are symlinked from this repo). The apps are those of a pg user who serves health and
 * metrics: Nest, pg, Terminus and prom-client are installed, while `mssql`, `@types/mssql`,
 * `@electric-sql/pglite` and `@opentelemetry/api` (tracing is on by default) are deliberately
 * absent, so a public type or a module that needs them fails here.
 */

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const TSC = join(ROOT, 'node_modules/typescript/bin/tsc');
const MANIFEST = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as {
  name: string;
  files: string[];
  bin: Record<string, string>;
  exports: Record<string, string | { types: string; default: string }>;
  dependencies: Record<string, string>;
  peerDependencies: Record<string, string>;
  peerDependenciesMeta: Record<string, { optional?: boolean }>;
};
const NAME = MANIFEST.name;

/** Each entry point, with the source module it is built from and the optional peers it may need. */
const ENTRY_POINTS: Record<string, { source: object; optionalPeers: string[] }> = {
  '.': { source: mainApi, optionalPeers: [] },
  './health': { source: healthApi, optionalPeers: ['@nestjs/terminus'] },
  './prometheus': { source: prometheusApi, optionalPeers: ['prom-client'] },
  './dashboard': { source: dashboardApi, optionalPeers: [] },
};
const OPTIONAL_PEERS = Object.keys(MANIFEST.peerDependenciesMeta).filter(
  (p) => MANIFEST.peerDependenciesMeta[p]!.optional,
);
const INSTALLED_PEERS = [
  '@nestjs/common',
  '@nestjs/core',
  '@nestjs/schedule',
  '@nestjs/terminus',
  '@nestjs/platform-express',
  'prom-client',
  'reflect-metadata',
  'rxjs',
  'pg',
  '@types/pg',
  '@types/node',
];
const ABSENT_PEERS = ['mssql', '@types/mssql', '@electric-sql/pglite', '@opentelemetry/api'];

const specifier = (entry: string) => (entry === '.' ? NAME : `${NAME}/${entry.slice(2)}`);

interface Run {
  status: number | null;
  stdout: string;
  stderr: string;
}

function run(command: string, args: string[], cwd: string): Run {
  const result = spawnSync(command, args, { cwd, encoding: 'utf8' });
  if (result.error) throw result.error;
  return { status: result.status, stdout: result.stdout, stderr: result.stderr };
}

function mustRun(command: string, args: string[], cwd: string): string {
  const result = run(command, args, cwd);
  if (result.status !== 0) {
    throw new Error(`${command} ${args.join(' ')} exited ${result.status}:\n${result.stdout}\n${result.stderr}`);
  }
  return result.stdout;
}

/** Like run(), without blocking: the type check runs while the other tests do. */
function runAsync(command: string, args: string[], cwd: string): Promise<Run> {
  return new Promise((done, fail) => {
    const child = spawn(command, args, { cwd });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (chunk: Buffer) => (stdout += chunk));
    child.stderr.on('data', (chunk: Buffer) => (stderr += chunk));
    child.on('error', fail);
    child.on('close', (status) => done({ status, stdout, stderr }));
  });
}

function filesUnder(dir: string): string[] {
  return readdirSync(dir, { recursive: true, withFileTypes: true })
    .filter((entry) => entry.isFile())
    .map((entry) => join(entry.parentPath, entry.name));
}

function write(path: string, text: string): void {
  mkdirSync(dirname(path), { recursive: true });
  writeFileSync(path, text);
}

/**
 * Loads every entry point both ways in one process and reports its export names, and whether
 * require() and import() gave the very same objects (one module instance, no dual package).
 * `first` is the app's own way of loading (require in CommonJS, import in ESM).
 */
const LOAD_REPORT = `
async function report(specifiers, first) {
  const result = {};
  for (const specifier of specifiers) {
    const a = await (first === 'require' ? require(specifier) : import(specifier));
    const b = await (first === 'require' ? import(specifier) : require(specifier));
    const keys = Object.keys(a).sort();
    const same = keys.length === Object.keys(b).length && keys.every((key) => a[key] === b[key]);
    result[specifier] = { keys, same };
  }
  return result;
}
`;

/**
 * A CommonJS Nest application, written as plain JavaScript: one job through a pg pool, and the
 * dashboard's page, script and overview over HTTP (its assets come from the package).
 */
const CJS_BOOT = `'use strict';
require('reflect-metadata');
const { Injectable, Module } = require('@nestjs/common');
const { NestFactory } = require('@nestjs/core');
const { ScheduleModule } = require('@nestjs/schedule');
const pg = require('pg');
const { QueueHandler, QueueProducer, SqlQueueModule } = require('${NAME}');
const { SqlQueueDashboardModule } = require('${NAME}/dashboard');

const [url, schema] = process.argv.slice(2);
setTimeout(() => {
  console.error('no job handled within 30 s');
  process.exit(1);
}, 30_000).unref();

let handled;
const job = new Promise((resolve) => (handled = resolve));
class PingHandler {
  async handle(payload, context) {
    handled({ payload, queue: context.queue });
  }
}
Injectable()(PingHandler);
QueueHandler('ping')(PingHandler);

// A transactional handler, as docs/exactly-once.md writes one: its statement runs in the job's transaction.
let ledgered;
const ledger = new Promise((resolve) => (ledgered = resolve));
class LedgerHandler {
  async handle(payload, context) {
    const { rows } = await context.transaction.query("SELECT now() = statement_timestamp() AS outside, 'in-tx' AS v");
    ledgered(rows[0]);
  }
}
Injectable()(LedgerHandler);
QueueHandler('ledger', { transactional: true, maxReaders: 2 })(LedgerHandler);

const pool = new pg.Pool({ connectionString: url, max: 4 });
class AppModule {}
Module({
  imports: [
    ScheduleModule.forRoot(),
    SqlQueueModule.forRoot({ connection: { pool }, schema }),
    SqlQueueDashboardModule.forRoot({ guard: 'none', readOnly: true }),
  ],
  providers: [PingHandler, LedgerHandler],
})(AppModule);

(async () => {
  const app = await NestFactory.create(AppModule, { logger: ['error'] });
  await app.listen(0, '127.0.0.1');
  await app.get(QueueProducer).enqueue('ping', { from: 'commonjs' });
  await app.get(QueueProducer).enqueue('ledger', {});
  const result = await job;
  result.ledger = await ledger;
  const base = 'http://127.0.0.1:' + app.getHttpServer().address().port + '/queues/';
  const page = await fetch(base);
  const html = await page.text();
  const script = await fetch(base + 'assets/dashboard.js');
  const overview = await (await fetch(base + 'api/overview')).json();
  result.dashboard = {
    page: page.status,
    linksScript: html.includes('assets/dashboard.js'),
    script: script.status,
    scriptType: script.headers.get('content-type'),
    queues: overview.queues.map((queue) => queue.queue),
  };
  await app.close();
  await pool.end();
  console.log(JSON.stringify(result));
})().catch((error) => {
  console.error(error);
  process.exit(1);
});
`;

/** A pg-only application's TypeScript, compiled unchanged as CommonJS and as ESM. */
const CONSUMER_TS = `import { Injectable, Module } from '@nestjs/common';
import { ScheduleModule } from '@nestjs/schedule';
import pg from 'pg';
import {
  QueueHandler,
  QueueProducer,
  SqlQueueModule,
  SqlQueueRateLimitedError,
  type JobContext,
  type QueueJobHandler,
  type CancelResult,
  type FlowUsage,
  type QueuePause,
  type SqlQueueConnection,
  type SqlQueueModuleOptions,
} from '${NAME}';
import { SqlQueueHealthModule } from '${NAME}/health';
import { SqlQueuePrometheusModule } from '${NAME}/prometheus';
import { SqlQueueDashboardModule, type SqlQueueDashboardOptions } from '${NAME}/dashboard';

const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL });
const connection: SqlQueueConnection = { pool };
const options: SqlQueueModuleOptions = {
  connection,
  schema: 'sqlqueue',
  queues: { exports: { concurrencyPerKey: 3, globalConcurrency: 20, rateLimit: { max: 100, perMs: 1_000 } } },
};
const dashboard: SqlQueueDashboardOptions = { guard: 'none', path: '/admin/queues', readOnly: true };

interface Ping {
  at: number;
}

@Injectable()
@QueueHandler('ping', { maxAttempts: 3 })
export class PingHandler implements QueueJobHandler<Ping, { pong: number }> {
  async handle(payload: Ping, context: JobContext): Promise<{ pong: number }> {
    console.log(payload.at, context.jobId, context.attempt);
    if (payload.at < 0) throw new SqlQueueRateLimitedError(1_000, 'partner API said 429');
    if (payload.at === 0) context.rateLimited(500);
    context.progress(100);
    return { pong: payload.at };
  }
}

@Injectable()
@QueueHandler('ledger', { transactional: true })
export class LedgerHandler implements QueueJobHandler<{ amount: number }> {
  async handle(payload: { amount: number }, context: JobContext): Promise<void> {
    const client = context.transaction as pg.PoolClient;
    await client.query('INSERT INTO ledger (amount) VALUES ($1)', [payload.amount]);
  }
}

@Injectable()
export class PingService {
  constructor(private readonly producer: QueueProducer) {}

  async ping(): Promise<string> {
    const client = await pool.connect();
    try {
      await client.query('BEGIN');
      const { jobId } = await this.producer.enqueue<Ping>('ping', { at: Date.now() }, { transaction: client });
      await client.query('COMMIT');
      return String(jobId);
    } finally {
      client.release();
    }
  }

  async stopAndWait(jobId: string): Promise<unknown> {
    const canceled: CancelResult = await this.producer.cancel(jobId, { reason: 'maintenance' });
    if (canceled.outcome === 'canceling') {
      const job = await this.producer.waitFor(jobId, { timeoutMs: 5_000 });
      return job.state === 'done' ? job.result : job.cancelReason;
    }
    return canceled.state;
  }

  async exportFor(customerId: string): Promise<FlowUsage> {
    await this.producer.enqueue('exports', { customerId }, { concurrencyKey: customerId });
    return this.producer.flowUsage('exports', { top: 5 });
  }

  async pauseForMaintenance(): Promise<QueuePause[]> {
    const paused: boolean = await this.producer.pauseQueue('ping', { reason: 'maintenance' });
    if (paused && (await this.producer.stats('ping')).paused) await this.producer.resumeQueue('ping');
    return this.producer.listPausedQueues();
  }
}

@Module({
  imports: [
    ScheduleModule.forRoot(),
    SqlQueueModule.forRoot(options),
    SqlQueueHealthModule,
    SqlQueuePrometheusModule.forRoot({}),
    SqlQueueDashboardModule.forRoot(dashboard),
  ],
  providers: [PingHandler, LedgerHandler, PingService],
})
export class AppModule {}
`;

/** Mistakes the compiler must report: each marked line, and nothing else, is an error. */
const MISTAKES_TS = `import { SqlQueueModule, type SqlQueueConnection } from '${NAME}';
import pg from 'pg';

export const notAPool: SqlQueueConnection = { pool: 'postgres://localhost/app' }; // expect error
export const clientAsPool: SqlQueueConnection = { pool: {} as pg.PoolClient }; // expect error
export const urlAsNumber = SqlQueueModule.forRoot({ connection: { dialect: 'postgres', url: 5432 } }); // expect error
`;

const SCRATCH_TSCONFIG = {
  compilerOptions: {
    target: 'ES2022',
    lib: ['ES2023'],
    module: 'nodenext',
    moduleResolution: 'nodenext',
    strict: true,
    skipLibCheck: false,
    esModuleInterop: true,
    experimentalDecorators: true,
    emitDecoratorMetadata: true,
    noEmit: true,
  },
  include: ['cjs-app/*.ts', 'esm-app/*.ts'],
};

/** Positions of `await` (and `for await`) outside any function: require() of ESM refuses them. */
function topLevelAwaits(file: string): string[] {
  const source = ts.createSourceFile(file, readFileSync(file, 'utf8'), ts.ScriptTarget.Latest, true, ts.ScriptKind.JS);
  const found: string[] = [];
  const visit = (node: ts.Node): void => {
    if (ts.isFunctionLike(node) || ts.isClassStaticBlockDeclaration(node)) return;
    if (ts.isAwaitExpression(node) || (ts.isForOfStatement(node) && node.awaitModifier)) {
      found.push(`${file}:${source.getLineAndCharacterOfPosition(node.getStart()).line + 1}`);
    }
    ts.forEachChild(node, visit);
  };
  visit(source);
  return found;
}

/** The packages a declaration file graph names, walking relative imports from `entry`. */
function declarationExternals(entry: string): Map<string, string> {
  const externals = new Map<string, string>(); // package → first file naming it
  const seen = new Set<string>();
  const visit = (file: string): void => {
    if (seen.has(file)) return;
    seen.add(file);
    const text = readFileSync(file, 'utf8');
    const specifiers = [
      ...text.matchAll(/\bfrom\s+['"]([^'"]+)['"]|\bimport\s*\(\s*['"]([^'"]+)['"]\s*\)|\bimport\s+['"]([^'"]+)['"]/g),
      ...text.matchAll(/\/\/\/\s*<reference\s+types=['"]([^'"]+)['"]/g),
    ].map((m) => (m[1] ?? m[2] ?? m[3])!);
    for (const spec of specifiers) {
      if (spec.startsWith('.')) {
        visit(resolve(dirname(file), spec.replace(/\.js$/, '.d.ts')));
      } else if (!spec.startsWith('node:')) {
        const name = spec.startsWith('@') ? spec.split('/').slice(0, 2).join('/') : spec.split('/')[0]!;
        if (!externals.has(name)) externals.set(name, file);
      }
    }
  };
  visit(entry);
  return externals;
}

describe('the packed package in a CommonJS and an ESM application', () => {
  let work: string;
  let apps: string;
  let installed: string;
  let typecheck: Promise<Run>;
  const schema = uniqueSchema('pkg');

  beforeAll(() => {
    work = mkdtempSync(join(tmpdir(), 'sqlqueue-package-'));
    // The build runs in a copy laid out like this repo, so its output (source map paths
    // included) is what `npm run build` makes here; nothing left in dist/ by an earlier build is
    // packed, and other test files or a build writing dist/ at the same time cannot race this one.
    const stage = join(work, 'stage');
    cpSync(join(ROOT, 'lib/src'), join(stage, 'lib/src'), { recursive: true });
    for (const entry of ['tsconfig.json', 'lib/tsconfig.lib.json', 'package.json', ...MANIFEST.files]) {
      // A pattern (docs/*.md) is staged as its folder; npm pack applies the pattern itself.
      const path = entry.includes('*') ? dirname(entry) : entry;
      if (!entry.startsWith('dist')) cpSync(join(ROOT, path), join(stage, path), { recursive: true });
    }
    symlinkSync(join(ROOT, 'node_modules'), join(stage, 'node_modules'), 'dir');
    // The build's library half (tsc, then the dashboard's assets beside the output).
    mustRun('npm', ['run', '--silent', 'build:lib'], stage);
    const packed = JSON.parse(
      mustRun('npm', ['pack', '--json', '--offline', '--no-update-notifier', '--pack-destination', work], stage),
    ) as [{ filename: string }];

    apps = join(work, 'apps');
    installed = join(apps, 'node_modules', NAME);
    mkdirSync(installed, { recursive: true });
    mustRun('tar', ['-xzf', join(work, packed[0].filename), '-C', installed, '--strip-components=1'], work);
    // The package's own dependencies (cron) as npm installs them, hoisted beside it, and the peers.
    for (const peer of [...Object.keys(MANIFEST.dependencies ?? {}), ...INSTALLED_PEERS]) {
      if (existsSync(join(apps, 'node_modules', peer))) continue;
      mkdirSync(dirname(join(apps, 'node_modules', peer)), { recursive: true });
      symlinkSync(join(ROOT, 'node_modules', peer), join(apps, 'node_modules', peer), 'dir');
    }
    const bin = join(apps, 'node_modules/.bin', NAME);
    mkdirSync(dirname(bin), { recursive: true });
    symlinkSync(join('..', NAME, MANIFEST.bin[NAME]!), bin); // as npm links a bin

    const entries = JSON.stringify(Object.keys(ENTRY_POINTS).map(specifier));
    write(join(apps, 'cjs-app/package.json'), JSON.stringify({ name: 'cjs-app', private: true, type: 'commonjs' }));
    write(
      join(apps, 'cjs-app/load.js'),
      `${LOAD_REPORT}\nreport(${entries}, 'require').then((r) => console.log(JSON.stringify(r)));\n`,
    );
    write(join(apps, 'cjs-app/boot.js'), CJS_BOOT);
    write(join(apps, 'esm-app/package.json'), JSON.stringify({ name: 'esm-app', private: true, type: 'module' }));
    write(
      join(apps, 'esm-app/load.js'),
      `import { createRequire } from 'node:module';\nconst require = createRequire(import.meta.url);\n` +
        `${LOAD_REPORT}\nconsole.log(JSON.stringify(await report(${entries}, 'import')));\n`,
    );
    for (const app of ['cjs-app', 'esm-app']) {
      write(join(apps, app, 'app.ts'), CONSUMER_TS);
      write(join(apps, app, 'mistakes.ts'), MISTAKES_TS);
    }
    write(join(apps, 'tsconfig.json'), JSON.stringify(SCRATCH_TSCONFIG));
    typecheck = runAsync(process.execPath, [TSC, '-p', 'tsconfig.json'], apps);
    typecheck.catch(() => undefined); // awaited by its test; a failure here must not go unhandled
  }, 120_000);

  afterAll(async () => {
    await typecheck?.catch(() => undefined);
    if (work) rmSync(work, { recursive: true, force: true });
    await dropPgSchema(schema);
  });

  it('ships the build and the docs only, every export and the bin included, and no optional peer', () => {
    const shipped = filesUnder(installed).map((file) => relative(installed, file));
    // The guides ship beside the README, so its links work in node_modules too (not the screenshots).
    const guides = readdirSync(join(ROOT, 'docs'))
      .filter((file) => file.endsWith('.md'))
      .map((file) => `docs/${file}`);
    expect(guides.length).toBeGreaterThan(3);
    expect(shipped.filter((file) => !file.startsWith('dist/lib/')).sort()).toEqual(
      ['CHANGELOG.md', 'LICENSE', 'README.md', 'package.json', ...guides].sort(),
    );
    expect(shipped.filter((file) => /\.ts$/.test(file) && !file.endsWith('.d.ts'))).toEqual([]);
    const exported = Object.entries(MANIFEST.exports).filter(([entry]) => entry !== './package.json');
    expect(exported.map(([entry]) => entry).sort()).toEqual(Object.keys(ENTRY_POINTS).sort());
    for (const [, target] of exported) {
      expect(target).toEqual({ types: expect.any(String), default: expect.any(String) });
      const { types, default: js } = target as { types: string; default: string };
      expect(shipped).toEqual(expect.arrayContaining([types.slice(2), js.slice(2)]));
    }
    expect(shipped).toContain(MANIFEST.bin[NAME]!.slice(2));
    // The scratch apps really lack the absent peers: nothing resolves them from the package.
    const fromPackage = createRequire(join(installed, 'package.json'));
    for (const absent of ABSENT_PEERS) {
      expect(() => fromPackage.resolve(`${absent}/package.json`), absent).toThrow();
    }
  });

  /** Runs an app's load.js: every entry point loads, with the source's exports, as one instance. */
  function expectEveryEntryPointFrom(app: string): Record<string, { keys: string[] }> {
    const result = run(process.execPath, ['load.js'], join(apps, app));
    expect(result.stderr).toBe('');
    const report = JSON.parse(result.stdout) as Record<string, { keys: string[]; same: boolean }>;
    for (const [entry, { source }] of Object.entries(ENTRY_POINTS)) {
      expect(report[specifier(entry)], entry).toEqual({ keys: Object.keys(source).sort(), same: true });
    }
    return report;
  }

  it('a CommonJS app require()s every entry point, and import() gives the very same objects', () => {
    const report = expectEveryEntryPointFrom('cjs-app');
    expect(report[NAME]!.keys).toEqual(expect.arrayContaining(['SqlQueueModule', 'QueueProducer', 'QueueHandler']));
    expect(report[`${NAME}/health`]!.keys).toContain('SqlQueueHealthModule');
    expect(report[`${NAME}/prometheus`]!.keys).toContain('SqlQueuePrometheusModule');
  });

  it('an ESM app import()s every entry point, and require() gives the very same objects', () => {
    expectEveryEntryPointFrom('esm-app');
  });

  it('a CommonJS Nest application runs a job through its pg pool', () => {
    const result = run(process.execPath, ['boot.js', PG_URL, schema], join(apps, 'cjs-app'));
    expect(result, result.stderr).toMatchObject({ status: 0 });
    expect(JSON.parse(result.stdout)).toEqual({
      payload: { from: 'commonjs' },
      queue: 'ping',
      dashboard: {
        page: 200,
        linksScript: true,
        script: 200,
        scriptType: expect.stringMatching(/^text\/javascript/),
        queues: ['ledger', 'ping'],
      },
      // now() is the transaction's start, statement_timestamp() this statement's: in a transaction they differ.
      ledger: { outside: false, v: 'in-tx' },
    });
  });

  it('no module of the package awaits at top level (require() of ESM refuses that)', () => {
    const modules = filesUnder(installed).filter((file) => file.endsWith('.js'));
    expect(modules.length).toBeGreaterThan(20);
    expect(modules.flatMap(topLevelAwaits)).toEqual([]);
  });

  it("each entry point's declarations name no optional peer but its own, and only declared peers", () => {
    for (const [entry, { optionalPeers }] of Object.entries(ENTRY_POINTS)) {
      const { types } = MANIFEST.exports[entry] as { types: string };
      const externals = declarationExternals(join(installed, types));
      const needed = [...externals.keys()];
      const where = needed.map((name) => `${name} (${relative(installed, externals.get(name)!)})`).join(', ');
      expect(
        needed.filter((name) => !(name in MANIFEST.peerDependencies)),
        `${entry}: ${where}`,
      ).toEqual([]);
      expect(
        needed.filter((name) => OPTIONAL_PEERS.includes(name) && !optionalPeers.includes(name)),
        `${entry}: ${where}`,
      ).toEqual([]);
    }
  });

  it('a pg-only TypeScript app compiles as CommonJS and as ESM (skipLibCheck off); wrong connections are errors', async () => {
    const { status, stdout, stderr } = await typecheck;
    const reported = [...stdout.matchAll(/^(\S+?)\((\d+),\d+\): error (TS\d+)/gm)].map((m) => `${m[1]}:${m[2]}`);
    const marked = MISTAKES_TS.split('\n').flatMap((line, i) => (line.endsWith('// expect error') ? [i + 1] : []));
    const expected = ['cjs-app', 'esm-app'].flatMap((app) => marked.map((line) => `${app}/mistakes.ts:${line}`));
    expect(reported.sort(), `${stdout}\n${stderr}`).toEqual(expected.sort());
    expect(stdout.split('\n').filter((line) => /error TS/.test(line))).toHaveLength(expected.length);
    expect(status).toBe(2); // errors reported, and nothing else went wrong
  }, 120_000);

  it('every shipped source map carries the TypeScript it points to', () => {
    const shipped = filesUnder(installed);
    const maps = shipped.filter((file) => file.endsWith('.map'));
    expect(maps.length).toBeGreaterThan(20);
    for (const map of maps) {
      const { sources, sourcesContent } = JSON.parse(readFileSync(map, 'utf8')) as {
        sources: string[];
        sourcesContent?: string[];
      };
      expect(sourcesContent?.length, map).toBe(sources.length);
      sources.forEach((source, i) => {
        // A path relative to the package (lib/src/…, as in this repo), not one of the build machine.
        const original = relative(installed, resolve(dirname(map), source));
        expect(original, map).toMatch(/^lib\/src\/.+\.ts$/);
        expect(sourcesContent![i], map).toBe(readFileSync(join(ROOT, original), 'utf8'));
      });
    }
    for (const js of shipped.filter((file) => file.endsWith('.js'))) {
      const url = /\/\/# sourceMappingURL=(\S+)\s*$/.exec(readFileSync(js, 'utf8'))?.[1];
      if (url) expect(maps, js).toContain(join(dirname(js), url));
    }
  });

  it('the bin prints both install scripts from the installed package, without mssql installed', () => {
    const bin = join(apps, 'node_modules/.bin', NAME);
    expect(readFileSync(bin, 'utf8').split('\n')[0]).toBe('#!/usr/bin/env node');
    for (const dialect of ['postgres', 'mssql']) {
      const result = run(process.execPath, [bin, 'sql', '--dialect', dialect, '--schema', 'pkgcheck'], apps);
      expect({ status: result.status, stderr: result.stderr }, dialect).toEqual({ status: 0, stderr: '' });
      expect(result.stdout, dialect).toMatch(/CREATE TABLE/i);
      expect(result.stdout, dialect).toContain('pkgcheck');
    }
    expect(run(process.execPath, [bin, '--help'], apps)).toMatchObject({ status: 0 });
  });
});
