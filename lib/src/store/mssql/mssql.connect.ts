import sql from 'mssql';
import { SqlQueueConfigError } from '../../core/errors.js';
import type { SqlQueueMssqlConfig, SqlQueueMssqlPool } from '../driver-shapes.js';
import { assertMssqlSessionOptions, mssqlConfigFromUrl } from './mssql.config.js';
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
    // mssql keeps the config a pool was built from on `config` (not in its typings).
    const poolConfig = (connection.pool as { config?: { options?: object } }).config;
    assertMssqlSessionOptions(poolConfig?.options, "in the shared pool's config.options");
    return new MssqlQueueStore(connection.pool, false, options.schema);
  }
  // The public shape types only the common fields (mssql is an optional peer); mssql checks the rest.
  const config =
    'config' in connection
      ? (connection.config as sql.config)
      : mssqlConfigFromUrl(connection.url, { poolSize: connection.poolSize });
  assertMssqlSessionOptions(
    config.options,
    'config' in connection ? 'in connection.config.options' : 'in the options connection.url sets',
  );
  const pool = new sql.ConnectionPool(config);
  // Errors on idle connections surface here; without a listener Node would treat them as fatal.
  pool.on('error', (error: Error) => options.onBackgroundError?.(error));
  return new MssqlQueueStore(pool, true, options.schema);
}
