#!/usr/bin/env node
import { realpathSync } from 'node:fs';
import { pathToFileURL } from 'node:url';
import { SqlQueueConfigError } from './core/errors.js';
import { assertSchemaName } from './core/validation.js';

/**
 * `npx nestjs-sql-queue sql --dialect mssql|postgres [--schema sqlqueue] [--from N]` prints the
 * install/upgrade script for a DBA to review and run by hand.
 *
 * The argument handling is `runCli`, which writes only through `out` and returns the exit code,
 * so tests drive it directly. A dialect's script module is loaded only once that dialect is
 * chosen: the PostgreSQL one pulls in `pg`, an optional peer a SQL Server user may not have.
 */

const BIN = 'nestjs-sql-queue';
const DEFAULT_SCHEMA = 'sqlqueue';
const DIALECTS = ['mssql', 'postgres'] as const;
type CliDialect = (typeof DIALECTS)[number];

/** Bad command line: reported on stderr with exit code 2, the usual code for usage errors. */
const EXIT_USAGE = 2;

export interface CliOutput {
  stdout: (text: string) => void;
  stderr: (text: string) => void;
}

export const USAGE = `Usage: ${BIN} sql --dialect <mssql|postgres> [--schema <name>] [--from <version>]

Prints the SQL script that installs the nestjs-sql-queue schema, or upgrades it from a given
version, so that a DBA can review it and run it (for example with migrations: 'check' in the
application, whose login then needs no DDL rights).

Commands:
  sql                 print the install/upgrade script to stdout

Options:
  --dialect <name>    mssql or postgres (required)
  --schema <name>     database schema holding the queue tables (default: ${DEFAULT_SCHEMA})
  --from <version>    schema version the database is at now; only later migrations are
                      printed (default: 0, a fresh install)
  -h, --help          show this help

Examples:
  ${BIN} sql --dialect postgres --schema ${DEFAULT_SCHEMA} | psql -v ON_ERROR_STOP=1 -d mydb
  ${BIN} sql --dialect mssql --schema ${DEFAULT_SCHEMA} > install.sql
  sqlcmd -S myserver -d mydb -I -b -i install.sql
`;

interface SqlCommand {
  dialect: CliDialect;
  schema: string;
  from: number;
}

class CliUsageError extends Error {}

/** Parses and runs the command line; returns the process exit code. */
export async function runCli(argv: readonly string[], out: CliOutput): Promise<number> {
  if (argv.some((arg) => arg === '--help' || arg === '-h') || argv[0] === 'help') {
    out.stdout(USAGE);
    return 0;
  }
  let command: SqlCommand;
  let script: DialectScripts;
  try {
    command = parseArguments(argv);
    script = await loadScripts(command.dialect);
    if (command.from > script.latest) {
      throw new CliUsageError(
        `--from ${command.from} is beyond the latest ${command.dialect} schema version this package knows (${script.latest})`,
      );
    }
  } catch (error) {
    if (error instanceof CliUsageError || error instanceof SqlQueueConfigError) {
      out.stderr(`${BIN}: ${error.message}\nRun '${BIN} --help' for usage.\n`);
      return EXIT_USAGE;
    }
    throw error;
  }
  out.stdout(script.install(command.schema, command.from));
  return 0;
}

function parseArguments(argv: readonly string[]): SqlCommand {
  const [command, ...rest] = argv;
  if (command === undefined) throw new CliUsageError('no command given (the only command is: sql)');
  if (command !== 'sql') throw new CliUsageError(`unknown command '${command}' (the only command is: sql)`);

  const options = new Map<string, string>();
  for (let i = 0; i < rest.length; i++) {
    const arg = rest[i]!;
    if (!arg.startsWith('--')) throw new CliUsageError(`unexpected argument '${arg}'`);
    const eq = arg.indexOf('=');
    const name = eq === -1 ? arg.slice(2) : arg.slice(2, eq);
    if (!['dialect', 'schema', 'from'].includes(name)) throw new CliUsageError(`unknown option '--${name}'`);
    if (options.has(name)) throw new CliUsageError(`option --${name} is given more than once`);
    let value: string | undefined;
    if (eq !== -1) value = arg.slice(eq + 1);
    else if (i + 1 < rest.length && !rest[i + 1]!.startsWith('--')) value = rest[++i];
    if (value === undefined || value === '') throw new CliUsageError(`option --${name} needs a value`);
    options.set(name, value);
  }

  const dialect = options.get('dialect');
  if (dialect === undefined) throw new CliUsageError('missing --dialect (mssql or postgres)');
  if (!isDialect(dialect)) throw new CliUsageError(`unknown dialect '${dialect}' (use mssql or postgres)`);

  const schema = assertSchemaName(options.get('schema') ?? DEFAULT_SCHEMA);

  const fromText = options.get('from') ?? '0';
  if (!/^\d+$/.test(fromText) || !Number.isSafeInteger(Number(fromText))) {
    throw new CliUsageError(`--from must be a schema version, a whole number from 0 up, got '${fromText}'`);
  }
  return { dialect, schema, from: Number(fromText) };
}

function isDialect(value: string): value is CliDialect {
  return (DIALECTS as readonly string[]).includes(value);
}

interface DialectScripts {
  latest: number;
  install: (schema: string, fromVersion: number) => string;
}

async function loadScripts(dialect: CliDialect): Promise<DialectScripts> {
  if (dialect === 'postgres') {
    const m = await import('./store/postgres/postgres.migrations.js');
    return { latest: m.PG_LATEST_VERSION, install: m.pgInstallScript };
  }
  const m = await import('./store/mssql/mssql.migrations.js');
  return { latest: m.MSSQL_LATEST_VERSION, install: m.mssqlInstallScript };
}

/**
 * True when Node started this file, not when a test or another module imports it. npm links
 * the bin (node_modules/.bin/nestjs-sql-queue) as a symlink, so argv[1] is resolved first;
 * Node itself reports the resolved path in import.meta.url.
 */
function isEntryPoint(): boolean {
  const started = process.argv[1];
  if (!started) return false;
  for (const candidate of [started, `${started}.js`]) {
    try {
      if (pathToFileURL(realpathSync(candidate)).href === import.meta.url) return true;
    } catch {
      // Not a file (yet another spelling of the path); try the next one.
    }
  }
  return false;
}

if (isEntryPoint()) {
  runCli(process.argv.slice(2), {
    stdout: (text) => process.stdout.write(text),
    stderr: (text) => process.stderr.write(text),
  }).then(
    (code) => {
      // exitCode, not process.exit(): exit() can cut off output still queued for a pipe
      // (`… | psql`), where stdout writes are asynchronous on some platforms.
      process.exitCode = code;
    },
    (error: unknown) => {
      process.stderr.write(`${BIN}: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`);
      process.exitCode = 1;
    },
  );
}
