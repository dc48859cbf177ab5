#!/usr/bin/env node
import { readFileSync, realpathSync } from 'node:fs';
import { pathToFileURL } from 'node:url';
import { SqlQueueConfigError } from './core/errors.js';
import { assertSchemaName } from './core/validation.js';

/**
 * `npx nestjs-sql-queue sql --dialect mssql|postgres [--schema sqlqueue] [--from N]` prints the
 * install/upgrade script for a DBA to review and run by hand; with `--broker` or
 * `--broker-config` (SQL Server only) the Service Broker setup follows, and the least-privilege
 * grants with `--grants-for-*`.
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
           [--grants-for-enqueuers <principal>] [--grants-for-scalers <principal>]
       ${BIN} sql --dialect mssql [--schema <name>] [--broker <name>]... [--broker-config <file.json>]
           [--broker-only] [--grants-for-readers <principal>] [--grants-for-senders <principal>]
           [--grants-for-admin <principal>]

Prints the SQL script that installs the nestjs-sql-queue schema, or upgrades it from a given
version, so that a DBA can review it and run it (for example with migrations: 'check' in the
application, whose login then needs no DDL rights). On SQL Server it can add the Service Broker
objects of broker queues (broker.setup: 'off' or 'print' in the application) and their grants.

Commands:
  sql                 print the install/upgrade script to stdout

Options:
  --dialect <name>    mssql or postgres (required)
  --schema <name>     database schema holding the queue tables (default: ${DEFAULT_SCHEMA})
  --from <version>    schema version the database is at now; only later migrations are
                      printed (default: 0, a fresh install)
  --grants-for-enqueuers <principal>
                      also print the GRANTs that let this role (or user) enqueue from SQL
                      through the installed function or procedure, and do nothing else
  --grants-for-scalers <principal>
                      also print the GRANTs that let an autoscaler's login (KEDA) read the
                      scale recommendation, and do nothing else
  -h, --help          show this help

Service Broker (--dialect mssql only):
  --broker <name>     a broker queue with default object names; repeat for more
  --broker-config <file.json>
                      the application's broker option as JSON ({ "queues": { … }, … }), for
                      queues with names of their own; --broker adds queues to it
  --broker-only       print only the Service Broker setup, not the table-queue schema
  --grants-for-readers <principal>, --grants-for-senders <principal>,
  --grants-for-admin <principal>
                      also print least-privilege GRANTs for these database principals

Examples:
  ${BIN} sql --dialect postgres --schema ${DEFAULT_SCHEMA} | psql -v ON_ERROR_STOP=1 -d mydb
  ${BIN} sql --dialect mssql --schema ${DEFAULT_SCHEMA} > install.sql
  sqlcmd -S myserver -d mydb -I -b -i install.sql
  ${BIN} sql --dialect mssql --broker-only --broker orders --grants-for-readers app_worker > broker.sql
  ${BIN} sql --dialect postgres --grants-for-enqueuers order_triggers | psql -v ON_ERROR_STOP=1 -d mydb
`;

interface SqlCommand {
  dialect: CliDialect;
  schema: string;
  from: number;
  /** --grants-for-enqueuers: a principal allowed to call the SQL enqueue only. */
  enqueuers: string | null;
  /** --grants-for-scalers: a principal allowed to read the scale recommendation only. */
  scalers: string | null;
  broker: BrokerCommand | null;
}

interface BrokerCommand {
  /** The broker option: from --broker-config, with --broker queues added. */
  options: unknown;
  only: boolean;
  grants: { readers?: string; senders?: string; admin?: string };
}

/** Options that take a value; --broker may repeat. */
const VALUE_OPTIONS = [
  'dialect',
  'schema',
  'from',
  'broker',
  'broker-config',
  'grants-for-readers',
  'grants-for-senders',
  'grants-for-admin',
  'grants-for-enqueuers',
  'grants-for-scalers',
];
const FLAG_OPTIONS = ['broker-only'];

class CliUsageError extends Error {}

/** Parses and runs the command line; returns the process exit code. */
export async function runCli(argv: readonly string[], out: CliOutput): Promise<number> {
  if (argv.some((arg) => arg === '--help' || arg === '-h') || argv[0] === 'help') {
    out.stdout(USAGE);
    return 0;
  }
  let text: string;
  try {
    const command = parseArguments(argv);
    const script = await loadScripts(command.dialect);
    if (command.from > script.latest) {
      throw new CliUsageError(
        `--from ${command.from} is beyond the latest ${command.dialect} schema version this package knows (${script.latest})`,
      );
    }
    text = command.broker?.only ? '' : script.install(command.schema, command.from);
    if (command.enqueuers !== null) text += script.enqueueGrants(command.schema, command.enqueuers);
    if (command.scalers !== null) text += script.scalerGrants(command.schema, command.scalers);
    if (command.broker) text += await brokerScripts(command.schema, command.broker);
  } catch (error) {
    if (error instanceof CliUsageError || error instanceof SqlQueueConfigError) {
      out.stderr(`${BIN}: ${error.message}\nRun '${BIN} --help' for usage.\n`);
      return EXIT_USAGE;
    }
    throw error;
  }
  // One write once everything is known: a bad broker option prints no half script.
  out.stdout(text);
  return 0;
}

/** Loaded only for Service Broker, which is SQL Server only. */
async function brokerScripts(schema: string, command: BrokerCommand): Promise<string> {
  const { resolveBrokerOptions } = await import('./broker/broker.options.js');
  const { brokerGrantsScript, brokerSetupScript } = await import('./broker/setup/index.js');
  const options = resolveBrokerOptions(command.options as Parameters<typeof resolveBrokerOptions>[0], schema, []);
  if (!options) throw new CliUsageError('no broker queue given (use --broker <name> or --broker-config <file.json>)');
  const grants = Object.values(command.grants).some((p) => p !== undefined);
  return brokerSetupScript(options) + (grants ? brokerGrantsScript(options, command.grants) : '');
}

function parseArguments(argv: readonly string[]): SqlCommand {
  const [command, ...rest] = argv;
  if (command === undefined) throw new CliUsageError('no command given (the only command is: sql)');
  if (command !== 'sql') throw new CliUsageError(`unknown command '${command}' (the only command is: sql)`);

  const options = new Map<string, string>();
  const brokers: string[] = [];
  const flags = new Set<string>();
  for (let i = 0; i < rest.length; i++) {
    const arg = rest[i]!;
    if (!arg.startsWith('--')) throw new CliUsageError(`unexpected argument '${arg}'`);
    const eq = arg.indexOf('=');
    const name = eq === -1 ? arg.slice(2) : arg.slice(2, eq);
    if (FLAG_OPTIONS.includes(name)) {
      if (eq !== -1) throw new CliUsageError(`option --${name} takes no value`);
      flags.add(name);
      continue;
    }
    if (!VALUE_OPTIONS.includes(name)) throw new CliUsageError(`unknown option '--${name}'`);
    if (name !== 'broker' && options.has(name)) throw new CliUsageError(`option --${name} is given more than once`);
    let value: string | undefined;
    if (eq !== -1) value = arg.slice(eq + 1);
    else if (i + 1 < rest.length && !rest[i + 1]!.startsWith('--')) value = rest[++i];
    if (value === undefined || value === '') throw new CliUsageError(`option --${name} needs a value`);
    if (name === 'broker') brokers.push(value);
    else options.set(name, value);
  }

  const dialect = options.get('dialect');
  if (dialect === undefined) throw new CliUsageError('missing --dialect (mssql or postgres)');
  if (!isDialect(dialect)) throw new CliUsageError(`unknown dialect '${dialect}' (use mssql or postgres)`);

  const schema = assertSchemaName(options.get('schema') ?? DEFAULT_SCHEMA);

  const fromText = options.get('from') ?? '0';
  if (!/^\d+$/.test(fromText) || !Number.isSafeInteger(Number(fromText))) {
    throw new CliUsageError(`--from must be a schema version, a whole number from 0 up, got '${fromText}'`);
  }
  return {
    dialect,
    schema,
    from: Number(fromText),
    enqueuers: options.get('grants-for-enqueuers') ?? null,
    scalers: options.get('grants-for-scalers') ?? null,
    broker: parseBroker(dialect, options, brokers, flags),
  };
}

function parseBroker(
  dialect: CliDialect,
  options: ReadonlyMap<string, string>,
  brokers: readonly string[],
  flags: ReadonlySet<string>,
): BrokerCommand | null {
  const given = [
    ...(brokers.length > 0 ? ['--broker'] : []),
    ...['broker-config', 'grants-for-readers', 'grants-for-senders', 'grants-for-admin']
      .filter((name) => options.has(name))
      .map((name) => `--${name}`),
    ...[...flags].map((name) => `--${name}`),
  ];
  if (given.length === 0) return null;
  if (dialect !== 'mssql') {
    throw new CliUsageError(`${given[0]} needs --dialect mssql (Service Broker is a SQL Server feature)`);
  }
  const file = options.get('broker-config');
  if (file === undefined && brokers.length === 0) {
    throw new CliUsageError(`${given[0]} needs the broker queues: --broker <name> or --broker-config <file.json>`);
  }
  if (flags.has('broker-only') && options.has('from')) {
    throw new CliUsageError('--from has no effect with --broker-only (the Service Broker setup has no versions)');
  }
  const config = file === undefined ? { queues: {} } : readBrokerConfig(file);
  const queues = (config as { queues?: unknown }).queues ?? {};
  if (typeof queues !== 'object' || queues === null || Array.isArray(queues)) {
    throw new CliUsageError(`--broker-config '${file}': "queues" must be an object of broker queues by name`);
  }
  for (const name of brokers) {
    if (Object.hasOwn(queues, name)) throw new CliUsageError(`broker queue '${name}' is given twice`);
    (queues as Record<string, unknown>)[name] = {};
  }
  return {
    options: { ...config, queues },
    only: flags.has('broker-only'),
    grants: {
      readers: options.get('grants-for-readers'),
      senders: options.get('grants-for-senders'),
      admin: options.get('grants-for-admin'),
    },
  };
}

function readBrokerConfig(file: string): object {
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (error) {
    throw new CliUsageError(`cannot read --broker-config '${file}': ${(error as Error).message}`);
  }
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (error) {
    throw new CliUsageError(`--broker-config '${file}' is not valid JSON: ${(error as Error).message}`);
  }
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    throw new CliUsageError(
      `--broker-config '${file}' must hold the broker option as a JSON object ({ "queues": { … } })`,
    );
  }
  return value;
}

function isDialect(value: string): value is CliDialect {
  return (DIALECTS as readonly string[]).includes(value);
}

interface DialectScripts {
  latest: number;
  install: (schema: string, fromVersion: number) => string;
  enqueueGrants: (schema: string, principal: string) => string;
  scalerGrants: (schema: string, principal: string) => string;
}

async function loadScripts(dialect: CliDialect): Promise<DialectScripts> {
  if (dialect === 'postgres') {
    const m = await import('./store/postgres/postgres.migrations.js');
    return {
      latest: m.PG_LATEST_VERSION,
      install: m.pgInstallScript,
      enqueueGrants: m.pgEnqueueGrantsScript,
      scalerGrants: m.pgScalerGrantsScript,
    };
  }
  const m = await import('./store/mssql/mssql.migrations.js');
  return {
    latest: m.MSSQL_LATEST_VERSION,
    install: m.mssqlInstallScript,
    enqueueGrants: m.mssqlEnqueueGrantsScript,
    scalerGrants: m.mssqlScalerGrantsScript,
  };
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
