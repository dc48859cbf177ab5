import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { resolveBrokerOptions } from '../../lib/src/broker/broker.options.js';
import { brokerGrantsScript, brokerSetupScript } from '../../lib/src/broker/setup/broker.setup.js';
import type { BrokerOptions } from '../../lib/src/broker/broker.types.js';
import { runCli, USAGE } from '../../lib/src/cli.js';
import { MSSQL_LATEST_VERSION, mssqlInstallScript } from '../../lib/src/store/mssql/mssql.migrations.js';
import { PG_LATEST_VERSION, pgInstallScript } from '../../lib/src/store/postgres/postgres.migrations.js';

async function cli(...argv: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  let stdout = '';
  let stderr = '';
  const code = await runCli(argv, {
    stdout: (text) => (stdout += text),
    stderr: (text) => (stderr += text),
  });
  return { code, stdout, stderr };
}

/** A usage error: exit code 2, nothing on stdout (so `… | psql` gets no half script), the reason on stderr. */
async function expectUsageError(argv: string[], message: string | RegExp): Promise<void> {
  const result = await cli(...argv);
  expect(result.code).toBe(2);
  expect(result.stdout).toBe('');
  expect(result.stderr).toMatch(message);
  expect(result.stderr).toContain("Run 'nestjs-sql-queue --help' for usage.");
}

describe('nestjs-sql-queue sql', () => {
  it('--grants-for-enqueuers prints, after the install script, the grants to call the SQL enqueue only', async () => {
    const pgScript = await cli(
      'sql',
      '--dialect',
      'postgres',
      '--schema',
      'demo',
      '--grants-for-enqueuers',
      'order_triggers',
    );
    expect(pgScript.code).toBe(0);
    expect(pgScript.stdout.startsWith(pgInstallScript('demo', 0))).toBe(true);
    expect(pgScript.stdout.slice(pgInstallScript('demo', 0).length)).toBe(
      `-- Lets "order_triggers" call "demo".enqueue(...) and nothing else (no table rights).
GRANT USAGE ON SCHEMA "demo" TO "order_triggers";
GRANT EXECUTE ON FUNCTION "demo".enqueue(text, jsonb, text, text, bigint, integer, integer, timestamptz, text) TO "order_triggers";
`,
    );
    const mssqlScript = await cli(
      'sql',
      '--dialect',
      'mssql',
      '--schema',
      'demo',
      '--from',
      String(MSSQL_LATEST_VERSION),
      '--grants-for-enqueuers',
      'CORP\\svc orders',
    );
    expect(mssqlScript.code).toBe(0);
    expect(mssqlScript.stdout).toContain('GRANT EXECUTE ON OBJECT::[demo].[Enqueue] TO [CORP\\svc orders];\nGO\n');
    const scalers = await cli(
      'sql',
      '--dialect',
      'mssql',
      '--from',
      String(MSSQL_LATEST_VERSION),
      '--grants-for-scalers',
      'keda',
    );
    expect(scalers.stdout).toContain('GRANT EXECUTE ON OBJECT::[sqlqueue].[DesiredReaders] TO [keda];\nGO\n');
    const pgScalers = await cli(
      'sql',
      '--dialect',
      'postgres',
      '--from',
      String(PG_LATEST_VERSION),
      '--grants-for-scalers',
      'keda',
    );
    expect(pgScalers.stdout).toContain(
      'GRANT EXECUTE ON FUNCTION "sqlqueue".desired_readers(text, integer, integer) TO "keda";\n',
    );
    await expectUsageError(
      ['sql', '--dialect', 'postgres', '--grants-for-enqueuers', 'x";drop'],
      /the database principal for enqueuers 'x";drop' is invalid/,
    );
  });

  it('prints the PostgreSQL install script for the schema, ending with the version row', async () => {
    const { code, stdout, stderr } = await cli('sql', '--dialect', 'postgres', '--schema', 'demo');
    expect(code).toBe(0);
    expect(stderr).toBe('');
    expect(stdout).toBe(pgInstallScript('demo', 0));
    expect(stdout).toContain('CREATE SCHEMA IF NOT EXISTS "demo";');
    expect(stdout).toContain('CREATE TABLE "demo".jobs (');
    expect(stdout).toContain(`INSERT INTO "demo".schema_version (version, description) VALUES (${PG_LATEST_VERSION}, `);
    expect(stdout.trimEnd().endsWith('COMMIT;')).toBe(true);
  });

  it('prints the SQL Server install script for the schema, in GO-separated batches', async () => {
    const { code, stdout, stderr } = await cli('sql', '--dialect', 'mssql', '--schema', 'demo');
    expect(code).toBe(0);
    expect(stderr).toBe('');
    expect(stdout).toBe(mssqlInstallScript('demo', 0));
    expect(stdout).toContain("IF SCHEMA_ID(N'demo') IS NULL EXEC (N'CREATE SCHEMA [demo];');");
    expect(stdout).toContain('CREATE TABLE [demo].[Jobs] (');
    expect(stdout).toContain(
      `INSERT INTO [demo].[SchemaVersion] ([Version], [Description]) VALUES (${MSSQL_LATEST_VERSION}, N'`,
    );
    expect(stdout).toMatch(/^GO$/m);
    expect(stdout.trimEnd().endsWith('COMMIT TRANSACTION;\nGO\nSET NOEXEC OFF;\nGO')).toBe(true);
    // After every batch the script stops executing if an error already rolled the transaction back.
    expect(stdout).toContain('IF @@TRANCOUNT = 0 SET NOEXEC ON;');
  });

  it("uses the schema 'sqlqueue' by default and accepts --name=value", async () => {
    const { code, stdout } = await cli('sql', '--dialect=postgres');
    expect(code).toBe(0);
    expect(stdout).toBe(pgInstallScript('sqlqueue', 0));
    expect((await cli('sql', '--dialect=mssql', '--schema=queue_2', '--from=0')).stdout).toBe(
      mssqlInstallScript('queue_2', 0),
    );
  });

  it('--from the latest version prints no migration but a valid, repeatable script', async () => {
    expect(PG_LATEST_VERSION).toBe(13);
    expect(MSSQL_LATEST_VERSION).toBe(17);
    const pg = await cli('sql', '--dialect', 'postgres', '--schema', 'demo', '--from', String(PG_LATEST_VERSION));
    expect(pg.code).toBe(0);
    expect(pg.stdout).toBe(pgInstallScript('demo', PG_LATEST_VERSION));
    expect(pg.stdout).not.toContain('INSERT INTO');
    expect(pg.stdout).not.toContain('CREATE TABLE "demo".jobs');
    expect(pg.stdout).toContain('BEGIN;');
    expect(pg.stdout).toContain('COMMIT;');

    const mssql = await cli('sql', '--dialect', 'mssql', '--schema', 'demo', '--from', String(MSSQL_LATEST_VERSION));
    expect(mssql.code).toBe(0);
    expect(mssql.stdout).toBe(mssqlInstallScript('demo', MSSQL_LATEST_VERSION));
    expect(mssql.stdout).not.toContain('INSERT INTO');
    expect(mssql.stdout).not.toContain('[Jobs]');
  });

  it('--from 2 (PostgreSQL) / --from 3 (SQL Server) prints the delayed state, then the later versions', async () => {
    // Each version's section of a script, by its "-- N:" heading.
    const section = (script: string, version: number) => {
      const end = script.indexOf(`-- ${version + 1}:`);
      return script.slice(script.indexOf(`-- ${version}:`), end < 0 ? undefined : end);
    };
    const pg = await cli('sql', '--dialect', 'postgres', '--schema', 'demo', '--from', '2');
    expect(pg.stdout).toContain(
      `CREATE INDEX jobs_delayed_ix ON "demo".jobs (queue, run_at, id) WHERE state = 'delayed'`,
    );
    expect(pg.stdout).toContain(`UPDATE "demo".jobs SET state = 'delayed' WHERE state = 'ready' AND run_at > now()`);
    expect(pg.stdout).not.toContain('CREATE TABLE "demo".queue_settings');
    expect(pg.stdout).toContain('-- 4: ordered groups');
    expect(pg.stdout).toContain('-- 5: recurring jobs');
    const mssql = await cli('sql', '--dialect', 'mssql', '--schema', 'demo', '--from', '3');
    expect(mssql.stdout).not.toContain('-- 3:');
    const delayed = section(mssql.stdout, 4);
    expect(delayed).toContain('ALTER TABLE [demo].[Jobs] DROP CONSTRAINT [CK_Jobs_State];');
    expect(delayed).toContain('CREATE NONCLUSTERED INDEX [IX_Jobs_Delayed]');
    expect(delayed).not.toContain('DROP_EXISTING');
    expect(mssql.stdout).toContain('-- 5:');
  });

  it('--from 1 prints version 2 (the queue settings) and later ones, not version 1', async () => {
    const pg = await cli('sql', '--dialect', 'postgres', '--schema', 'demo', '--from', '1');
    expect(pg.stdout).toContain('CREATE TABLE "demo".queue_settings');
    expect(pg.stdout).not.toContain('CREATE TABLE "demo".jobs');
    expect(pg.stdout).toContain(`INSERT INTO "demo".schema_version (version, description) VALUES (2, `);
    const mssql = await cli('sql', '--dialect', 'mssql', '--schema', 'demo', '--from', '1');
    expect(mssql.stdout).toContain('CREATE TABLE [demo].[QueueSettings]');
    expect(mssql.stdout).toContain('CREATE TYPE [demo].[JobInputListV2]');
    expect(mssql.stdout).not.toContain('CREATE TABLE [demo].[Jobs]');
  });

  it('--from 2 prints only SQL Server version 3: the indexes, re-keyed with DROP_EXISTING', async () => {
    const mssql = await cli('sql', '--dialect', 'mssql', '--schema', 'demo', '--from', '2');
    expect(mssql.code).toBe(0);
    expect(mssql.stdout).toContain('-- 3: indexes for the reaper');
    expect(mssql.stdout).toContain(
      "CREATE NONCLUSTERED INDEX [IX_Jobs_Leased] ON [demo].[Jobs] ([LeaseUntil], [Queue]) INCLUDE ([Attempts]) WHERE [State] = 'leased' WITH (DROP_EXISTING = ON);",
    );
    const version3 = mssql.stdout.slice(0, mssql.stdout.indexOf('-- 4:'));
    expect(version3).not.toContain('[QueueSettings]');
    expect(mssql.stdout).toContain('VALUES (3, N');
  });

  it('--help and -h print the usage on stdout and succeed', async () => {
    for (const argv of [['--help'], ['-h'], ['help'], ['sql', '--help'], ['sql', '--dialect', 'oracle', '-h']]) {
      const result = await cli(...argv);
      expect(result, argv.join(' ')).toEqual({ code: 0, stdout: USAGE, stderr: '' });
    }
    expect(USAGE).toContain('--dialect <name>');
    expect(USAGE).toContain('--schema <name>');
    expect(USAGE).toContain('--from <version>');
  });
});

describe('nestjs-sql-queue: bad command lines', () => {
  it('refuses a missing or unknown command', async () => {
    await expectUsageError([], /no command given/);
    await expectUsageError(['install', '--dialect', 'postgres'], /unknown command 'install'/);
  });

  it('refuses a missing or unknown dialect', async () => {
    await expectUsageError(['sql'], /missing --dialect \(mssql or postgres\)/);
    await expectUsageError(['sql', '--schema', 'demo'], /missing --dialect/);
    await expectUsageError(['sql', '--dialect', 'oracle'], /unknown dialect 'oracle' \(use mssql or postgres\)/);
    await expectUsageError(['sql', '--dialect', 'MSSQL'], /unknown dialect 'MSSQL'/);
    await expectUsageError(['sql', '--dialect'], /option --dialect needs a value/);
    await expectUsageError(['sql', '--dialect', '--schema', 'demo'], /option --dialect needs a value/);
  });

  it('refuses a schema name that is not a plain identifier', async () => {
    await expectUsageError(
      ['sql', '--dialect', 'postgres', '--schema', 'x"; drop'],
      /schema name 'x"; drop' is invalid: start with a letter or '_'/,
    );
    await expectUsageError(['sql', '--dialect', 'mssql', '--schema', 'a]b'], /schema name 'a\]b' is invalid/);
    await expectUsageError(['sql', '--dialect', 'mssql', '--schema', '1abc'], /schema name '1abc' is invalid/);
    await expectUsageError(['sql', '--dialect', 'mssql', '--schema='], /option --schema needs a value/);
  });

  it('refuses a --from that is not a whole number from 0, or beyond the latest version', async () => {
    for (const bad of ['-1', '1.5', 'abc', '1e3', ' 1', '0x1', '99999999999999999999']) {
      await expectUsageError(
        ['sql', '--dialect', 'postgres', `--from=${bad}`],
        `--from must be a schema version, a whole number from 0 up, got '${bad}'`,
      );
    }
    await expectUsageError(
      ['sql', '--dialect', 'postgres', '--from', String(PG_LATEST_VERSION + 1)],
      `--from ${PG_LATEST_VERSION + 1} is beyond the latest postgres schema version this package knows (${PG_LATEST_VERSION})`,
    );
    await expectUsageError(
      ['sql', '--dialect', 'mssql', '--from', String(MSSQL_LATEST_VERSION + 1)],
      `--from ${MSSQL_LATEST_VERSION + 1} is beyond the latest mssql schema version this package knows (${MSSQL_LATEST_VERSION})`,
    );
  });

  it('refuses unknown, repeated and stray arguments', async () => {
    await expectUsageError(['sql', '--dialect', 'postgres', '--force'], /unknown option '--force'/);
    await expectUsageError(['sql', '--dialect', 'postgres', '--dialect', 'mssql'], /--dialect is given more than once/);
    await expectUsageError(['sql', '--dialect', 'postgres', 'extra'], /unexpected argument 'extra'/);
    await expectUsageError(['sql', '-d', 'postgres'], /unexpected argument '-d'/);
  });
});

describe('nestjs-sql-queue sql: Service Broker', () => {
  const broker = (raw: BrokerOptions, schema = 'sqlqueue') => resolveBrokerOptions(raw, schema, [])!;
  const configFile = (content: string) => {
    const file = join(mkdtempSync(join(tmpdir(), 'sqlqueue-cli-')), 'broker.json');
    writeFileSync(file, content);
    return file;
  };

  it('prints the Service Broker setup after the table-queue script', async () => {
    const { code, stdout, stderr } = await cli('sql', '--dialect', 'mssql', '--schema', 'demo', '--broker', 'orders');
    expect({ code, stderr }).toEqual({ code: 0, stderr: '' });
    expect(stdout).toBe(mssqlInstallScript('demo', 0) + brokerSetupScript(broker({ queues: { orders: {} } }, 'demo')));
    expect(stdout).toContain('CREATE QUEUE [demo].[orders_TargetQueue]');
  });

  it('--broker-only prints the setup alone, for every --broker, then the grants asked for', async () => {
    const options = broker({ queues: { orders: {}, mail: {} } });
    const only = await cli('sql', '--dialect=mssql', '--broker-only', '--broker', 'orders', '--broker=mail');
    expect(only).toEqual({ code: 0, stdout: brokerSetupScript(options), stderr: '' });
    const grants = { readers: 'app_worker', senders: 'DOMAIN\\web app' };
    const withGrants = await cli(
      'sql',
      '--dialect',
      'mssql',
      '--broker-only',
      '--broker',
      'orders',
      '--broker',
      'mail',
      '--grants-for-readers',
      grants.readers,
      '--grants-for-senders',
      grants.senders,
    );
    expect(withGrants.stdout).toBe(brokerSetupScript(options) + brokerGrantsScript(options, grants));
    expect(withGrants.stdout).toContain('GRANT RECEIVE ON [sqlqueue].[orders_TargetQueue] TO [app_worker];');
    expect(withGrants.stdout).not.toContain('GRANT ALTER');
  });

  it('--broker-config reads the broker option as JSON; --broker adds queues to it', async () => {
    const raw = { queues: { work: { queue: 'ops.Work', service: '//example.com/work', format: 'xml' } } };
    const file = configFile(JSON.stringify(raw));
    const { code, stdout } = await cli(
      'sql',
      '--dialect',
      'mssql',
      '--broker-only',
      '--broker-config',
      file,
      '--broker',
      'mail',
    );
    expect(code).toBe(0);
    expect(stdout).toBe(brokerSetupScript(broker({ queues: { ...raw.queues, mail: {} } } as BrokerOptions)));
    expect(stdout).toContain('CREATE SERVICE [//example.com/work] ON QUEUE [ops].[Work]');
    expect(stdout).toContain('VALIDATION = WELL_FORMED_XML;');
  });

  it('refuses broker options on PostgreSQL, without queues, or malformed', async () => {
    await expectUsageError(
      ['sql', '--dialect', 'postgres', '--broker', 'orders'],
      '--broker needs --dialect mssql (Service Broker is a SQL Server feature)',
    );
    await expectUsageError(['sql', '--dialect', 'postgres', '--broker-only'], /--broker-only needs --dialect mssql/);
    await expectUsageError(
      ['sql', '--dialect', 'mssql', '--broker-only'],
      '--broker-only needs the broker queues: --broker <name> or --broker-config <file.json>',
    );
    await expectUsageError(
      ['sql', '--dialect', 'mssql', '--grants-for-readers', 'x'],
      /--grants-for-readers needs the broker queues/,
    );
    await expectUsageError(
      ['sql', '--dialect', 'mssql', '--broker-only=yes', '--broker', 'a'],
      'option --broker-only takes no value',
    );
    await expectUsageError(['sql', '--dialect', 'mssql', '--broker'], 'option --broker needs a value');
    await expectUsageError(
      ['sql', '--dialect', 'mssql', '--broker', 'a', '--broker', 'a'],
      "broker queue 'a' is given twice",
    );
    await expectUsageError(
      ['sql', '--dialect', 'mssql', '--broker-only', '--from', '2', '--broker', 'a'],
      '--from has no effect with --broker-only',
    );
    await expectUsageError(['sql', '--dialect', 'mssql', '--broker', 'a b'], /queue name 'a b' is invalid/);
    await expectUsageError(
      ['sql', '--dialect', 'mssql', '--broker', 'a', '--grants-for-admin', 'x]y'],
      "the database principal for admin 'x]y' is invalid",
    );
    await expectUsageError(
      ['sql', '--dialect', 'mssql', '--broker-config', configFile('{"queues": {"a": {"maxReader": 2}}}')],
      "broker.queues['a']: unknown option 'maxReader' (did you mean 'maxReaders'?)",
    );
    await expectUsageError(['sql', '--dialect', 'mssql', '--broker-config', configFile('{oops')], /is not valid JSON/);
    await expectUsageError(
      ['sql', '--dialect', 'mssql', '--broker-config', configFile('[1]')],
      /must hold the broker option as a JSON object/,
    );
    await expectUsageError(
      ['sql', '--dialect', 'mssql', '--broker-config', configFile('{"queues": []}')],
      /"queues" must be an object of broker queues by name/,
    );
    await expectUsageError(
      ['sql', '--dialect', 'mssql', '--broker-config', '/nonexistent/broker.json'],
      /cannot read --broker-config/,
    );
  });

  it('documents the broker options in the usage', () => {
    for (const option of [
      '--broker <name>',
      '--broker-config <file.json>',
      '--broker-only',
      '--grants-for-readers',
      '--grants-for-senders',
      '--grants-for-admin',
    ]) {
      expect(USAGE).toContain(option);
    }
  });
});
