import { SqlQueueConfigError } from '../core/errors.js';
import type { QueueStore } from '../core/queue-store.js';
import { assertSchemaName, describe } from '../core/validation.js';
import type { SqlQueueMssqlConfig, SqlQueueMssqlPool, SqlQueuePgPool, SqlQueuePGlite } from './driver-shapes.js';

/**
 * Where the queue lives. The drivers are optional peers: only the chosen one is loaded, and
 * these types name none of them (see driver-shapes.ts), so any application compiles them.
 */
export type SqlQueueConnection =
  /** `queryTimeoutMs` (default 60 s) fails a statement stuck on a silently dead connection. */
  | { dialect: 'postgres'; url: string; poolSize?: number; queryTimeoutMs?: number }
  | { dialect: 'postgres'; pglite: SqlQueuePGlite }
  | { dialect: 'mssql'; url: string; poolSize?: number }
  | { dialect: 'mssql'; config: SqlQueueMssqlConfig }
  /** The application's own pool (pg.Pool or mssql.ConnectionPool): shared, never closed by us. */
  | { pool: SqlQueuePgPool | SqlQueueMssqlPool; dialect?: 'postgres' | 'mssql' };

export interface CreateStoreOptions {
  schema: string;
  onBackgroundError?: (error: Error) => void;
}

/**
 * Validates a connection option and builds the matching store. Fails with a message that
 * names the problem (unknown dialect, missing driver package, bad URL) before connecting.
 */
export async function createQueueStore(
  connection: SqlQueueConnection,
  options: CreateStoreOptions,
): Promise<QueueStore> {
  assertSchemaName(options.schema);
  if (!connection || typeof connection !== 'object') {
    throw new SqlQueueConfigError(`connection must be an object, got ${describe(connection)}`);
  }
  const dialect = dialectOf(connection);
  if (dialect === 'postgres') {
    if ('pglite' in connection) {
      if (!connection.pglite || typeof (connection.pglite as { query?: unknown }).query !== 'function') {
        throw new SqlQueueConfigError('connection.pglite must be a PGlite instance');
      }
      // Embedded PostgreSQL needs no `pg` package: load only the store and the PGlite driver.
      const [{ PostgresQueueStore }, { PGliteDriver }] = await Promise.all([
        import('./postgres/postgres.store.js'),
        import('./postgres/postgres.driver.js'),
      ]);
      return new PostgresQueueStore(new PGliteDriver(connection.pglite, false), options.schema);
    }
    const { createPostgresStore } = await loadDriver('pg', () => import('./postgres/postgres.connect.js'));
    if ('pool' in connection) return createPostgresStore({ pool: connection.pool as SqlQueuePgPool }, options);
    if ('url' in connection) {
      const { url, poolSize } = connection;
      const queryTimeoutMs = 'queryTimeoutMs' in connection ? connection.queryTimeoutMs : undefined;
      return createPostgresStore({ url, poolSize, queryTimeoutMs }, options);
    }
    throw new SqlQueueConfigError("a postgres connection needs 'url', 'pool' or 'pglite'");
  }
  const { createMssqlStore } = await loadDriver('mssql', () => import('./mssql/mssql.connect.js'));
  if ('pool' in connection) return createMssqlStore({ pool: connection.pool as SqlQueueMssqlPool }, options);
  if ('config' in connection) return createMssqlStore({ config: connection.config }, options);
  if ('url' in connection) return createMssqlStore({ url: connection.url, poolSize: connection.poolSize }, options);
  throw new SqlQueueConfigError("an mssql connection needs 'url', 'config' or 'pool'");
}

function dialectOf(connection: SqlQueueConnection): 'postgres' | 'mssql' {
  if ('pool' in connection && connection.dialect === undefined) {
    const pool = connection.pool as unknown as Record<string, unknown> | null;
    if (pool && typeof pool.totalCount === 'number' && typeof pool.connect === 'function') return 'postgres';
    if (pool && typeof pool.request === 'function' && 'connected' in pool) return 'mssql';
    throw new SqlQueueConfigError('connection.pool must be a pg.Pool or an mssql ConnectionPool');
  }
  const dialect = (connection as { dialect?: unknown }).dialect;
  if (dialect !== 'postgres' && dialect !== 'mssql') {
    throw new SqlQueueConfigError(`connection.dialect must be 'mssql' or 'postgres', got ${describe(dialect)}`);
  }
  return dialect;
}

async function loadDriver<T>(driver: string, load: () => Promise<T>): Promise<T> {
  try {
    return await load();
  } catch (error) {
    const code = (error as { code?: string }).code;
    if (code === 'ERR_MODULE_NOT_FOUND' || code === 'MODULE_NOT_FOUND') {
      throw new SqlQueueConfigError(`the '${driver}' package is needed for this connection: npm install ${driver}`, {
        cause: error,
      });
    }
    throw error;
  }
}
