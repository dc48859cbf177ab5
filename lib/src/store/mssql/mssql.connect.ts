import sql from 'mssql';
import { SqlQueueConfigError } from '../../core/errors.js';
import type { SqlQueueMssqlConfig, SqlQueueMssqlPool } from '../driver-shapes.js';
import { MssqlQueueStore } from './mssql.store.js';

export type MssqlConnection =
  /** An mssql config object; the store opens and closes its own pool. */
  | { config: SqlQueueMssqlConfig }
  /** `mssql://user:password@host:1433/database?encrypt=true` or an ADO string (`Server=…;Database=…`). */
  | { url: string; poolSize?: number }
  /** The application's pool: shared, never closed by the store. */
  | { pool: SqlQueueMssqlPool };

export interface MssqlStoreOptions {
  schema: string;
  onBackgroundError?: (error: Error) => void;
}

export function createMssqlStore(connection: MssqlConnection, options: MssqlStoreOptions): MssqlQueueStore {
  if ('pool' in connection) {
    if (!(connection.pool instanceof sql.ConnectionPool)) {
      throw new SqlQueueConfigError('connection.pool must be an mssql ConnectionPool');
    }
    return new MssqlQueueStore(connection.pool, false, options.schema);
  }
  // The public shape types only the common fields (mssql is an optional peer); mssql checks the rest.
  const config =
    'config' in connection
      ? (connection.config as sql.config)
      : mssqlConfigFromUrl(connection.url, connection.poolSize);
  const pool = new sql.ConnectionPool(config);
  // Errors on idle connections surface here; without a listener Node would treat them as fatal.
  pool.on('error', (error: Error) => options.onBackgroundError?.(error));
  return new MssqlQueueStore(pool, true, options.schema);
}

/**
 * Accepts the URL form used by SQLQUEUE_MSSQL_URL and container docs, or an ADO connection
 * string as the mssql package documents it.
 */
export function mssqlConfigFromUrl(url: string, poolSize = 10): sql.config {
  if (typeof url !== 'string' || url.length === 0) {
    throw new SqlQueueConfigError(
      "connection.url must be 'mssql://user:password@host:1433/database' or an ADO connection string",
    );
  }
  if (!/^(mssql|sqlserver):\/\//i.test(url)) {
    const parsed = sql.ConnectionPool.parseConnectionString(url) as sql.config;
    return { ...parsed, pool: { ...parsed.pool, max: parsed.pool?.max ?? poolSize } };
  }
  let parsed: URL;
  try {
    parsed = new URL(url.replace(/^sqlserver:/i, 'mssql:'));
  } catch {
    throw new SqlQueueConfigError('connection.url is not a valid URL');
  }
  const params = parsed.searchParams;
  const flag = (name: string, fallback: boolean) =>
    params.has(name) ? ['true', '1', 'yes'].includes(params.get(name)!.toLowerCase()) : fallback;
  const database = decodeURIComponent(parsed.pathname.replace(/^\//, ''));
  if (!parsed.hostname || !database) {
    throw new SqlQueueConfigError(
      "connection.url needs a host and a database: 'mssql://user:password@host:1433/database'",
    );
  }
  return {
    server: parsed.hostname,
    port: parsed.port ? Number(parsed.port) : 1433,
    user: decodeURIComponent(parsed.username),
    password: decodeURIComponent(parsed.password),
    database,
    pool: { max: Number(params.get('poolSize') ?? poolSize), min: 0, idleTimeoutMillis: 30_000 },
    options: {
      encrypt: flag('encrypt', true),
      trustServerCertificate: flag('trustServerCertificate', false),
      appName: params.get('appName') ?? 'nestjs-sql-queue',
    },
  };
}
