import pg from 'pg';

/**
 * What a job costs the database, counted on the wire of this process (issue 26): every statement
 * node-postgres sends (pools included), and the transactions they commit (an autocommit statement
 * is one; BEGIN … COMMIT is one). Exact and immediate, where pg_stat_database's counters reach the
 * view only when each backend flushes them (up to 10 s idle); the bench cross-checks the two once
 * (`crossCheckCommits`). PostgreSQL only: SQL Server's figures would come from its DMVs.
 */
export interface DbCost {
  statementsPerJob: number;
  commitsPerJob: number;
}

const wire = { statements: 0, commits: 0 };
const inTransaction = new WeakSet<object>();

const originalQuery = pg.Client.prototype.query;
pg.Client.prototype.query = function (this: pg.Client, ...args: unknown[]) {
  wire.statements++;
  const config = args[0];
  const text = (typeof config === 'string' ? config : ((config as { text?: string } | null)?.text ?? '')).trimStart();
  const verb = text.slice(0, 8).toUpperCase();
  if (verb.startsWith('BEGIN') || verb.startsWith('START')) inTransaction.add(this);
  else if (verb.startsWith('COMMIT') || verb.startsWith('END')) {
    inTransaction.delete(this);
    wire.commits++;
  } else if (verb.startsWith('ROLLBACK')) inTransaction.delete(this);
  else if (!inTransaction.has(this)) wire.commits++;
  return (originalQuery as (...a: unknown[]) => unknown).apply(this, args);
} as typeof pg.Client.prototype.query;

export function wireCounters(): { statements: number; commits: number } {
  return { ...wire };
}

/** The cost per job of `jobs` jobs between two readings of wireCounters(). */
export function costPerJob(before: { statements: number; commits: number }, jobs: number): DbCost {
  const now = wireCounters();
  const round = (value: number) => Math.round(value * 1000) / 1000;
  return {
    statementsPerJob: round((now.statements - before.statements) / Math.max(1, jobs)),
    commitsPerJob: round((now.commits - before.commits) / Math.max(1, jobs)),
  };
}

/**
 * pg_stat_database's xact_commit of the database over `work`, read after every backend has
 * flushed (their idle flush runs within 10 s; the work's own connections are closed by it), next
 * to what the wire counted: they should agree but for the bench's own few statements.
 */
export async function crossCheckCommits(
  url: string,
  work: () => Promise<void>,
): Promise<{ server: number; wire: number }> {
  await new Promise((resolve) => setTimeout(resolve, 11_000));
  const serverBefore = await serverCommits(url);
  const wireBefore = wireCounters().commits;
  await work();
  const wireAfter = wireCounters().commits;
  await new Promise((resolve) => setTimeout(resolve, 11_000));
  const serverAfter = await serverCommits(url);
  return { server: serverAfter - serverBefore, wire: wireAfter - wireBefore };
}

/** The transactions the database has committed so far (pg_stat_database.xact_commit, as flushed). */
export async function serverCommits(url: string): Promise<number> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    const { rows } = await client.query<{ n: string }>(
      'SELECT xact_commit::text AS n FROM pg_stat_database WHERE datname = current_database()',
    );
    return Number(rows[0]!.n);
  } finally {
    await client.end();
  }
}
