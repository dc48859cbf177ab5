import pg from 'pg';
import { SqlQueueConfigError } from '../../core/errors.js';
import { assertInteger, INT_MAX } from '../../core/validation.js';
import type { SqlQueuePgPool, SqlQueuePGlite } from '../driver-shapes.js';
import { PGliteDriver, type PgDriver } from './postgres.driver.js';
import { NodePgDriver } from './postgres.node-pg.js';
import { PostgresQueueStore } from './postgres.store.js';

export type PostgresConnection =
  /** A connection string; the store opens and closes its own pool. */
  | { url: string; poolSize?: number; applicationName?: string; queryTimeoutMs?: number }
  /** The application's pool: shared, never closed by the store. */
  | { pool: SqlQueuePgPool }
  /** Embedded PostgreSQL (for zero-setup apps and tests); closed by the store only if `ownsDb`. */
  | { pglite: SqlQueuePGlite; ownsDb?: boolean };

export interface PostgresStoreOptions {
  schema: string;
  onBackgroundError?: (error: Error) => void;
}

export function createPostgresStore(connection: PostgresConnection, options: PostgresStoreOptions): PostgresQueueStore {
  return new PostgresQueueStore(
    createPgDriver(connection, options.onBackgroundError ?? (() => undefined)),
    options.schema,
  );
}

function createPgDriver(connection: PostgresConnection, onBackgroundError: (error: Error) => void): PgDriver {
  if ('pglite' in connection) return new PGliteDriver(connection.pglite, connection.ownsDb ?? false);
  if ('pool' in connection) {
    if (
      !(connection.pool instanceof pg.Pool) &&
      typeof (connection.pool as { connect?: unknown }).connect !== 'function'
    ) {
      throw new SqlQueueConfigError('connection.pool must be a pg.Pool');
    }
    return new NodePgDriver(connection.pool as pg.Pool, false, onBackgroundError);
  }
  if (typeof connection.url !== 'string' || !/^postgres(ql)?:\/\//.test(connection.url)) {
    throw new SqlQueueConfigError(
      "connection.url must be a PostgreSQL URL ('postgres://user:password@host:5432/database')",
    );
  }
  const poolSize = assertInteger('connection.poolSize', connection.poolSize ?? 10, 1, 1_000);
  const queryTimeoutMs = assertInteger('connection.queryTimeoutMs', connection.queryTimeoutMs ?? 60_000, 1, INT_MAX);
  const pool = new pg.Pool({
    connectionString: connection.url,
    max: poolSize,
    application_name: connection.applicationName ?? 'nestjs-sql-queue',
    connectionTimeoutMillis: 10_000,
    // A connection that silently died (half-open TCP after a network cut) must fail rather than
    // hang a claim forever: keepalives detect the dead peer, and the read timeout fails the
    // statement, after which the pool discards the connection.
    keepAlive: true,
    keepAliveInitialDelayMillis: 10_000,
    query_timeout: queryTimeoutMs,
  });
  // An idle client that loses its connection emits 'error' on the pool; without a listener
  // Node would crash the process. The next query simply opens a new connection.
  pool.on('error', onBackgroundError);
  return new NodePgDriver(pool, true, onBackgroundError);
}
