import { createRequire } from 'node:module';
import { SqlQueueConfigError } from '../../core/errors.js';
import { assertInteger, describe, INT_MAX, nearestName } from '../../core/validation.js';

// Loaded by the main entry point: nothing here imports `mssql` (an optional peer) at load time.

/**
 * What {@link mssqlConfigFromUrl} returns: fits `new mssql.ConnectionPool(config)` and the
 * queue's `{ dialect: 'mssql', config }` alike. An ADO string may set further mssql options.
 */
export interface SqlQueueMssqlUrlConfig {
  server: string;
  port?: number;
  user?: string;
  password?: string;
  domain?: string;
  database?: string;
  connectionTimeout?: number;
  requestTimeout?: number;
  options: {
    encrypt?: boolean | 'strict';
    trustServerCertificate?: boolean;
    instanceName?: string;
    appName?: string;
  };
  pool: { max: number; min?: number; idleTimeoutMillis?: number };
}

const URL_FORM = "'mssql://user:password@host:1433/database' or an ADO connection string ('Server=…;Database=…')";
const PARAMS = ['encrypt', 'trustServerCertificate', 'instanceName', 'appName', 'poolSize', 'connectTimeout'];

/**
 * The mssql connection config for a `mssql://` / `sqlserver://` URL or an ADO connection string,
 * exactly as the queue builds it from `{ dialect: 'mssql', url }`. Use it to open one pool that
 * the application and the queue share (`{ pool }`).
 *
 * URL query parameters (names in any case): `encrypt` (true, false or strict; default true),
 * `trustServerCertificate` (default false), `instanceName`, `appName` (default nestjs-sql-queue),
 * `poolSize` and `connectTimeout` (ms). A named instance is also written `host%5CINSTANCE`.
 *
 * @param options.poolSize most connections (default 10); `poolSize` in the URL or
 *   `Max Pool Size` in an ADO string takes precedence.
 * @throws SqlQueueConfigError on a malformed URL or an unknown or invalid parameter, before any
 *   connection is attempted. The message never repeats the URL (it carries a password).
 */
export function mssqlConfigFromUrl(url: string, options: { poolSize?: number } = {}): SqlQueueMssqlUrlConfig {
  const poolSize = assertInteger('poolSize', options.poolSize ?? 10, 1, 1_000);
  if (typeof url !== 'string' || url.trim().length === 0) {
    throw new SqlQueueConfigError(`connection.url must be ${URL_FORM}, got ${describe(url)}`);
  }
  if (/^[a-z][a-z0-9+.-]*:\/\//i.test(url) && !/^(mssql|sqlserver):\/\//i.test(url)) {
    throw new SqlQueueConfigError(`connection.url must be ${URL_FORM}; its scheme is not mssql: or sqlserver:`);
  }
  return /^(mssql|sqlserver):\/\//i.test(url) ? fromUrl(url, poolSize) : fromAdoString(url, poolSize);
}

function fromUrl(url: string, poolSize: number): SqlQueueMssqlUrlConfig {
  let parsed: URL;
  try {
    parsed = new URL(url.replace(/^sqlserver:/i, 'mssql:'));
  } catch {
    const hint = url.includes('\\') ? ": write a named instance as 'host%5CINSTANCE' or '?instanceName=INSTANCE'" : '';
    throw new SqlQueueConfigError(`connection.url is not a valid URL${hint}; expected ${URL_FORM}`);
  }
  const params = new Map<string, string>();
  for (const [name, value] of parsed.searchParams) {
    const known = PARAMS.find((p) => p.toLowerCase() === name.toLowerCase());
    if (!known) {
      const near = nearestName(name, PARAMS);
      throw new SqlQueueConfigError(
        `connection.url: unknown parameter '${name}'${near ? ` (did you mean '${near}'?)` : ''}; valid parameters: ${PARAMS.join(', ')}`,
      );
    }
    params.set(known, value);
  }
  // `host\INSTANCE` as SQL Server tools write it; URL hosts take the backslash encoded, and
  // IPv6 literals come back in brackets that a socket connect does not take.
  const [server, hostInstance] = decode(parsed.hostname, 'host')
    .replace(/^\[(.*)\]$/, '$1')
    .split('\\', 2);
  const database = decode(parsed.pathname.replace(/^\//, ''), 'database');
  if (!server || !database) {
    throw new SqlQueueConfigError(`connection.url needs a host and a database: ${URL_FORM}`);
  }
  if (hostInstance !== undefined && params.has('instanceName')) {
    throw new SqlQueueConfigError(
      'connection.url names the instance twice (host\\INSTANCE and instanceName): keep one',
    );
  }
  const instanceName = hostInstance ?? params.get('instanceName');
  if (instanceName !== undefined && parsed.port) {
    // tedious reaches a named instance through SQL Browser (UDP 1434) and ignores a port then.
    throw new SqlQueueConfigError(
      'connection.url names both a port and an instance: keep one (an instance needs no port)',
    );
  }
  const config: SqlQueueMssqlUrlConfig = {
    server,
    user: decode(parsed.username, 'user'),
    password: decode(parsed.password, 'password'),
    database,
    pool: { max: intParam(params, 'poolSize', 1_000) ?? poolSize, min: 0, idleTimeoutMillis: 30_000 },
    options: {
      encrypt: params.get('encrypt')?.toLowerCase() === 'strict' ? 'strict' : flagParam(params, 'encrypt', true),
      trustServerCertificate: flagParam(params, 'trustServerCertificate', false),
      appName: params.get('appName') ?? 'nestjs-sql-queue',
    },
  };
  if (instanceName) config.options.instanceName = instanceName;
  else config.port = parsed.port ? Number(parsed.port) : 1433;
  const connectTimeout = intParam(params, 'connectTimeout', INT_MAX);
  if (connectTimeout !== undefined) config.connectionTimeout = connectTimeout;
  return config;
}

function decode(part: string, what: string): string {
  try {
    return decodeURIComponent(part);
  } catch {
    throw new SqlQueueConfigError(`connection.url: the ${what} is not validly percent-encoded (write '%' as %25)`);
  }
}

function flagParam(params: Map<string, string>, name: string, fallback: boolean): boolean {
  const value = params.get(name);
  if (value === undefined) return fallback;
  if (/^(true|1|yes)$/i.test(value)) return true;
  if (/^(false|0|no)$/i.test(value)) return false;
  const choices = name === 'encrypt' ? 'true, false or strict' : 'true or false';
  throw new SqlQueueConfigError(`connection.url: ${name} must be ${choices}, got ${describe(value)}`);
}

function intParam(params: Map<string, string>, name: string, max: number): number | undefined {
  const value = params.get(name);
  return value === undefined ? undefined : assertInteger(`connection.url: ${name}`, Number(value), 1, max);
}

interface MssqlParser {
  ConnectionPool: { parseConnectionString(text: string): Partial<SqlQueueMssqlUrlConfig> };
}

/** ADO strings are parsed by mssql itself, loaded only here: a URL needs no driver to parse. */
function fromAdoString(text: string, poolSize: number): SqlQueueMssqlUrlConfig {
  let mssql: MssqlParser;
  try {
    mssql = createRequire(import.meta.url)('mssql') as MssqlParser;
  } catch (error) {
    if ((error as { code?: unknown }).code !== 'MODULE_NOT_FOUND') throw error;
    throw new SqlQueueConfigError("an ADO connection string is parsed by the 'mssql' package: npm install mssql", {
      cause: error,
    });
  }
  let parsed: Partial<SqlQueueMssqlUrlConfig>;
  try {
    parsed = mssql.ConnectionPool.parseConnectionString(text);
  } catch (error) {
    throw new SqlQueueConfigError(`connection.url is not a valid ADO connection string: ${(error as Error).message}`, {
      cause: error,
    });
  }
  if (!parsed.server) {
    throw new SqlQueueConfigError(`connection.url names no server: expected ${URL_FORM}`);
  }
  return {
    ...parsed,
    server: parsed.server,
    options: { ...parsed.options },
    pool: { ...parsed.pool, max: parsed.pool?.max ?? poolSize },
  };
}

/**
 * Refuses tedious options that would make the queue's SQL wrong without any error, whether the
 * queue opens the pool or shares the application's. `where` says where the options come from
 * ("in connection.config.options").
 */
export function assertMssqlSessionOptions(tediousOptions: object | undefined, where: string): void {
  const options = tediousOptions as { useUTC?: unknown; enableImplicitTransactions?: unknown } | undefined;
  if (options?.useUTC === false) {
    throw new SqlQueueConfigError(
      `useUTC is false ${where}, which the queue cannot work with: tedious would then send and read ` +
        "datetime2 values in this process's local time, while the queue stores UTC (SYSUTCDATETIME()), " +
        'so every stored and returned time (run at, leases, timestamps) would be off by the UTC offset. ' +
        'Leave useUTC at its default, true.',
    );
  }
  if (options?.enableImplicitTransactions === true) {
    throw new SqlQueueConfigError(
      `enableImplicitTransactions is true ${where}, which the queue cannot work with: a statement ` +
        'outside a transaction would then open one that stays open until an explicit COMMIT, so ' +
        'connections would go back to the pool holding locks and uncommitted writes, and the ' +
        "queue's statements refuse a connection with an open transaction. Leave it at its default, false.",
    );
  }
}
