import { afterAll, describe, expect, it } from 'vitest';
import { runCli } from '../../lib/src/cli.js';
import { createPostgresStore } from '../../lib/src/store/postgres/postgres.connect.js';
import { PG_LATEST_VERSION, PG_MIGRATIONS, pgBootstrap } from '../../lib/src/store/postgres/postgres.migrations.js';
import { dropPgSchema, PG_URL, sql, uniqueSchema } from '../helpers/databases.js';
import { maxAttemptsAfterRecording } from '../helpers/queue-settings.js';
import { waitFor } from '../helpers/wait-for.js';

/** What a DBA does: print the script with the CLI, then run it as one text (as psql -f would). */
async function printScript(...argv: string[]): Promise<string> {
  let stdout = '';
  let stderr = '';
  const code = await runCli(argv, { stdout: (text) => (stdout += text), stderr: (text) => (stderr += text) });
  expect({ code, stderr }).toEqual({ code: 0, stderr: '' });
  return stdout;
}

async function runScript(script: string): Promise<void> {
  // No parameters: the simple query protocol runs the whole multi-statement script.
  await sql(PG_URL, script);
}

async function recordedVersions(schema: string): Promise<number[]> {
  const rows = await sql<{ version: number }>(
    PG_URL,
    `SELECT version FROM "${schema}".schema_version ORDER BY version`,
  );
  return rows.map((row) => row.version);
}

describe('the printed PostgreSQL script installs a schema the store accepts', () => {
  const schema = uniqueSchema('cli');

  afterAll(() => dropPgSchema(schema));

  it('installs every version, and migrate("check") accepts the result', async () => {
    await runScript(await printScript('sql', '--dialect', 'postgres', '--schema', schema));
    expect(await recordedVersions(schema)).toEqual(Array.from({ length: PG_LATEST_VERSION }, (_, i) => i + 1));

    const store = createPostgresStore({ url: PG_URL, poolSize: 1 }, { schema });
    try {
      await expect(store.migrate('check')).resolves.toEqual({ current: PG_LATEST_VERSION, latest: PG_LATEST_VERSION });
      // The tables are usable, not merely present.
      expect(await store.stats('cli.smoke')).toMatchObject({ queue: 'cli.smoke', ready: 0, leased: 0, dead: 0 });
    } finally {
      await store.close();
    }
  });

  it('the upgrade script from the latest version is a no-op that can be run again', async () => {
    const upgrade = await printScript(
      'sql',
      '--dialect',
      'postgres',
      '--schema',
      schema,
      '--from',
      `${PG_LATEST_VERSION}`,
    );
    await runScript(upgrade);
    await runScript(upgrade);
    expect(await recordedVersions(schema)).toHaveLength(PG_LATEST_VERSION);
  });
});

describe('a schema at version 1 (before queue settings) upgrades, keeping its jobs', () => {
  const byScript = uniqueSchema('cliv1');
  const byAuto = uniqueSchema('autov1');

  afterAll(async () => {
    await dropPgSchema(byScript);
    await dropPgSchema(byAuto);
  });

  /** What version 1 of the package installed (migrations are append-only), and one of its jobs. */
  async function installVersion1(schema: string): Promise<string> {
    const statements = [
      ...pgBootstrap(schema),
      ...PG_MIGRATIONS.find((m) => m.version === 1)!.statements(schema),
      `INSERT INTO "${schema}".schema_version (version, description) VALUES (1, 'version 1')`,
    ];
    await runScript(statements.join(';\n'));
    const [row] = await sql<{ id: string }>(
      PG_URL,
      `INSERT INTO "${schema}".jobs (queue, state, payload, run_at, max_attempts) VALUES ('old.q', 'ready', '{"v":1}', now(), 5) RETURNING id::text AS id`,
    );
    return row!.id;
  }

  async function expectUpgraded(schema: string, oldJob: string): Promise<void> {
    expect(await recordedVersions(schema)).toEqual(Array.from({ length: PG_LATEST_VERSION }, (_, i) => i + 1));
    const store = createPostgresStore({ url: PG_URL, poolSize: 1 }, { schema });
    try {
      await expect(store.migrate('check')).resolves.toEqual({ current: PG_LATEST_VERSION, latest: PG_LATEST_VERSION });
      expect(await store.getJob(oldJob)).toMatchObject({ queue: 'old.q', state: 'ready', maxAttempts: 5 });
      expect(await maxAttemptsAfterRecording(store, 'old.q', 8)).toBe(8);
    } finally {
      await store.close();
    }
  }

  it("with the script printed by '--from 1' ('check' names it first)", async () => {
    const oldJob = await installVersion1(byScript);
    const store = createPostgresStore({ url: PG_URL, poolSize: 1 }, { schema: byScript });
    await expect(store.migrate('check')).rejects.toThrow(
      new RegExp(`at version 1, this nestjs-sql-queue needs ${PG_LATEST_VERSION}: .*--from 1`),
    );
    await store.close();
    await runScript(await printScript('sql', '--dialect', 'postgres', '--schema', byScript, '--from', '1'));
    await expectUpgraded(byScript, oldJob);
  });

  it("with migrations 'auto'", async () => {
    const oldJob = await installVersion1(byAuto);
    const store = createPostgresStore({ url: PG_URL, poolSize: 1 }, { schema: byAuto });
    await expect(store.migrate('auto')).resolves.toEqual({ current: PG_LATEST_VERSION, latest: PG_LATEST_VERSION });
    await store.close();
    await expectUpgraded(byAuto, oldJob);
  });
});

describe('a schema at version 2 (delayed jobs in the ready index) upgrades with delayed jobs in flight', () => {
  const schema = uniqueSchema('autov2');

  afterAll(() => dropPgSchema(schema));

  it("with migrations 'auto': jobs not due yet wait as delayed and are claimed once due", async () => {
    await runScript(
      [
        ...pgBootstrap(schema),
        ...PG_MIGRATIONS.filter((m) => m.version <= 2).flatMap((m) => m.statements(schema)),
        `INSERT INTO "${schema}".schema_version (version, description) VALUES (1, 'version 1'), (2, 'version 2')`,
      ].join(';\n'),
    );
    // As version 2 wrote them: every waiting job 'ready', whatever its run_at.
    const insert = (priority: number, runAt: string) =>
      sql<{ id: string }>(
        PG_URL,
        `INSERT INTO "${schema}".jobs (queue, state, payload, priority, run_at, max_attempts)
         VALUES ('v2.q', 'ready', '{}', ${priority}, ${runAt}, 5) RETURNING id::text AS id`,
      ).then((rows) => rows[0]!.id);
    const due = await insert(0, 'now()');
    const later = await insert(5, "now() + interval '1 hour'");
    const soon = await insert(5, "now() + interval '1 second'");

    const store = createPostgresStore({ url: PG_URL, poolSize: 1 }, { schema });
    try {
      await expect(store.migrate('auto')).resolves.toEqual({ current: PG_LATEST_VERSION, latest: PG_LATEST_VERSION });
      expect((await store.getJob(due))!.state).toBe('ready');
      expect((await store.getJob(later))!.state).toBe('delayed');
      expect((await store.getJob(soon))!.state).toBe('delayed');
      expect(await store.stats('v2.q')).toMatchObject({ ready: 1, delayed: 2 });
      const claim = () => store.claim({ queue: 'v2.q', limit: 1, leaseMs: 30_000, workerId: 'upgrade-test' });
      expect((await claim()).map((c) => c.id)).toEqual([due]);
      const next = await waitFor(claim, (c) => c.length > 0, { what: 'the job due one second after the upgrade' });
      expect(next.map((c) => [c.id, c.attempt])).toEqual([[soon, 1]]);
      expect(await store.stats('v2.q')).toMatchObject({ ready: 0, delayed: 1, leased: 2 });
    } finally {
      await store.close();
    }
  });
});
