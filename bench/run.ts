/**
 * `npm run bench`: the benchmark of bench/README.md, against the local PostgreSQL (override
 * with SQLQUEUE_PG_URL). Every figure with a reference is compared with a raw `pg` loop
 * measured in the same run, because absolute numbers drift on shared machines.
 *
 *   npm run bench                 full run (about 5 minutes)
 *   npm run bench -- --quick      smaller sizes, for a smoke check
 *   npm run bench -- --only=drain,latency
 *
 * With SQLQUEUE_MSSQL_URL set, enqueue and drain also run against SQL Server (ours only: the raw
 * reference loops are written for PostgreSQL).
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { dropSchema, openStore, PG_URL, POSTGRES, schemaName, type Result, type Target } from './common.js';
import { drainCase, drainOnce } from './cases/drain.js';
import { enqueueCase } from './cases/enqueue.js';
import { flowCase } from './cases/flow.js';
import { groupsCase } from './cases/groups.js';
import { growthCase } from './cases/growth.js';
import { idleCase } from './cases/idle.js';
import { idlePodsCase } from './cases/idle-pods.js';
import { latencyCase } from './cases/latency.js';
import { transactionalCase } from './cases/transactional.js';
import { sqlEnqueueCase } from './cases/sql-enqueue.js';
import { crossCheckCommits } from './db-cost.js';

const args = process.argv.slice(2);
const quick = args.includes('--quick');
const only = args
  .find((a) => a.startsWith('--only='))
  ?.slice('--only='.length)
  .split(',');
const scale = quick ? 0.2 : 1;

const mssql: Target | null = process.env.SQLQUEUE_MSSQL_URL
  ? { dialect: 'mssql', url: process.env.SQLQUEUE_MSSQL_URL }
  : null;

const cases: [string, () => Promise<Result[]>][] = [
  ['enqueue', () => enqueueCase(POSTGRES, scale)],
  ['drain', () => drainCase(POSTGRES, scale)],
  ...(mssql
    ? ([
        ['enqueue', () => enqueueCase(mssql, scale)],
        ['drain', () => drainCase(mssql, scale)],
      ] as [string, () => Promise<Result[]>][])
    : []),
  ['flow', () => flowCase(POSTGRES, scale)],
  ['transactional', () => transactionalCase(scale)],
  ['sql-enqueue', () => sqlEnqueueCase(scale)],
  ['latency', () => latencyCase(PG_URL, quick ? 5 : 20)],
  ['growth', () => growthCase(PG_URL, quick ? 200_000 : 1_000_000, Math.round(20_000 * scale))],
  ['idle', () => idleCase(PG_URL, quick ? 10 : 30)],
  ['idle-pods', () => idlePodsCase(PG_URL, quick ? 10 : 30)],
  [
    'groups',
    () =>
      groupsCase(PG_URL, {
        drainTotal: Math.round(20_000 * scale),
        bigGroups: quick ? 100_000 : 1_000_000,
        samples: quick ? 100 : 300,
        drainCapMs: quick ? 10_000 : 30_000,
      }),
  ],
];

function ratio(result: Result): number | undefined {
  return result.reference ? Math.round((result.value / result.reference.value) * 1000) / 10 : undefined;
}

function verdict(result: Result): string {
  if (result.pass !== undefined) return result.pass ? 'PASS' : 'MISS';
  const match = result.target?.match(/^>= (\d+)% of reference$/);
  if (!match || !result.reference) return '';
  return (ratio(result) ?? 0) >= Number(match[1]) ? 'PASS' : 'MISS';
}

const results: Result[] = [];
const started = Date.now();
for (const [name, run] of cases) {
  if (only && !only.includes(name)) continue;
  process.stderr.write(`running ${name}…\n`);
  results.push(...(await run()));
}

// The wire's commit count against pg_stat_database's, once, on a README-defaults drain: the
// figures per job above are the wire's (exact and immediate), this says they are the server's too.
let commitCheck: { jobs: number; server: number; wire: number } | null = null;
if (!only || only.includes('drain')) {
  const schema = schemaName('commitcheck');
  const store = await openStore(PG_URL, schema, 20);
  const jobs = quick ? 2_000 : 10_000;
  try {
    const counted = await crossCheckCommits(PG_URL, async () => {
      await drainOnce(store, 'commit-check', jobs, 10, 'defaults');
    });
    commitCheck = { jobs, ...counted };
  } finally {
    await store.close();
    await dropSchema(PG_URL, schema);
  }
}

const rows = results.map((r) => [
  r.case,
  r.variant,
  `${r.value.toLocaleString('en')} ${r.unit}`,
  r.reference ? `${r.reference.value.toLocaleString('en')} (${r.reference.name})` : '',
  ratio(r) === undefined ? '' : `${ratio(r)}%`,
  r.target ?? '',
  verdict(r),
  r.dbCost ? String(r.dbCost.statementsPerJob) : '',
  r.dbCost ? String(r.dbCost.commitsPerJob) : '',
]);
const header = ['case', 'variant', 'ours', 'reference', 'ratio', 'target', '', 'statements/job', 'commits/job'];
const widths = header.map((h, i) => Math.max(h.length, ...rows.map((row) => row[i]!.length)));
const line = (cells: string[]) => cells.map((c, i) => c.padEnd(widths[i]!)).join(' | ');
process.stdout.write(`${line(header)}\n${widths.map((w) => '-'.repeat(w)).join('-|-')}\n`);
for (const row of rows) process.stdout.write(`${line(row)}\n`);
if (commitCheck) {
  process.stdout.write(
    `\ncommits of a ${commitCheck.jobs}-job README-defaults drain (with its enqueue): pg_stat_database ${commitCheck.server}, counted on the wire ${commitCheck.wire}\n`,
  );
}

const report = {
  date: new Date().toISOString(),
  node: process.version,
  quick,
  durationSeconds: Math.round((Date.now() - started) / 1000),
  commitCheck,
  results: results.map((r) => ({ ...r, ratioPercent: ratio(r), verdict: verdict(r) || undefined })),
};
process.stdout.write(`\n${JSON.stringify(report, null, 2)}\n`);
// A partial run (--only) must not replace the results of a full one: it goes beside them.
const file = only ? 'partial' : quick ? 'quick' : 'latest';
mkdirSync(new URL('../../../bench/results/', import.meta.url), { recursive: true });
writeFileSync(new URL(`../../../bench/results/${file}.json`, import.meta.url), `${JSON.stringify(report, null, 2)}\n`);
