import { mkdir } from 'node:fs/promises';
import { Logger, type OnApplicationShutdown } from '@nestjs/common';
import type { PGlite, Transaction as PGliteTransaction } from '@electric-sql/pglite';
import type sqlNamespace from 'mssql';
import { mssqlConfigFromUrl, type SqlQueueConnection, type SqlQueueMssqlUrlConfig } from 'nestjs-sql-queue';
import pg from 'pg';
import type { SampleConfig } from '../app.config.js';
import { mssqlStatements, postgresStatements, type SampleStatements } from './sample.sql.js';

/** Runs one of the sample's statements; parameters are positional ($1… / @p1…). */
export interface SampleQueryable {
  query<R = Record<string, unknown>>(text: string, params?: unknown[]): Promise<R[]>;
}

/** An open transaction: statements on it, and the handle QueueProducer.enqueue takes as `transaction`. */
export interface SampleTransaction extends SampleQueryable {
  readonly handle: unknown;
}

/**
 * The app's own database access, shared with the queue: one pool (or one embedded PGlite)
 * serves both, and a transaction here can carry an enqueue. Closed last, after the queue's
 * consumer has drained (Nest runs every beforeApplicationShutdown before any of these).
 */
export abstract class SampleDatabase implements OnApplicationShutdown {
  abstract readonly kind: 'pg' | 'pglite' | 'mssql';
  /** What SqlQueueModule connects through: this pool or PGlite, shared, never closed by the queue. */
  abstract readonly queueConnection: SqlQueueConnection;

  constructor(readonly sql: SampleStatements) {}

  abstract query<R = Record<string, unknown>>(text: string, params?: unknown[]): Promise<R[]>;
  abstract transaction<T>(work: (tx: SampleTransaction) => Promise<T>): Promise<T>;
  /** A unique constraint refused the write (a duplicate business key). */
  abstract isUniqueViolation(error: unknown): boolean;
  abstract close(): Promise<void>;

  async onApplicationShutdown(): Promise<void> {
    await this.close();
  }
}

class PgSampleDatabase extends SampleDatabase {
  readonly kind = 'pg';
  readonly queueConnection: SqlQueueConnection;

  constructor(
    private readonly pool: pg.Pool,
    schema: string,
  ) {
    super(postgresStatements(schema));
    this.queueConnection = { pool };
  }

  async query<R>(text: string, params: unknown[] = []): Promise<R[]> {
    return (await this.pool.query(text, params)).rows as R[];
  }

  async transaction<T>(work: (tx: SampleTransaction) => Promise<T>): Promise<T> {
    const client = await this.pool.connect();
    // While checked out, a client's dropped connection is reported as an 'error' event that
    // nobody else listens to; unheard, it would end the process.
    let broken: Error | undefined;
    const onError = (error: Error) => {
      broken = error;
    };
    client.on('error', onError);
    try {
      await client.query('BEGIN');
      const result = await work({
        handle: client,
        query: async <R>(text: string, params: unknown[] = []) => (await client.query(text, params)).rows as R[],
      });
      await client.query('COMMIT');
      return result;
    } catch (error) {
      if (!broken) await client.query('ROLLBACK').catch(() => undefined);
      throw error;
    } finally {
      client.removeListener('error', onError);
      client.release(broken);
    }
  }

  isUniqueViolation(error: unknown): boolean {
    return (error as { code?: unknown })?.code === '23505';
  }

  close(): Promise<void> {
    return this.pool.end();
  }
}

class PGliteSampleDatabase extends SampleDatabase {
  readonly kind = 'pglite';
  readonly queueConnection: SqlQueueConnection;

  constructor(
    private readonly db: PGlite,
    schema: string,
  ) {
    super(postgresStatements(schema));
    this.queueConnection = { dialect: 'postgres', pglite: db };
  }

  async query<R>(text: string, params: unknown[] = []): Promise<R[]> {
    return (await this.db.query<R>(text, params)).rows;
  }

  /** PGlite is one session: everything inside must go through `tx`, or it waits for the commit. */
  transaction<T>(work: (tx: SampleTransaction) => Promise<T>): Promise<T> {
    return this.db.transaction((tx: PGliteTransaction) =>
      work({
        handle: tx,
        query: async <R>(text: string, params: unknown[] = []) => (await tx.query<R>(text, params)).rows,
      }),
    );
  }

  isUniqueViolation(error: unknown): boolean {
    return (error as { code?: unknown })?.code === '23505';
  }

  async close(): Promise<void> {
    if (!this.db.closed) await this.db.close();
  }
}

class MssqlSampleDatabase extends SampleDatabase {
  readonly kind = 'mssql';
  readonly queueConnection: SqlQueueConnection;

  constructor(
    private readonly mssql: typeof sqlNamespace,
    private readonly pool: sqlNamespace.ConnectionPool,
    schema: string,
  ) {
    super(mssqlStatements(schema));
    this.queueConnection = { pool };
  }

  private static bindParams(request: sqlNamespace.Request, params: unknown[]): sqlNamespace.Request {
    params.forEach((value, i) => request.input(`p${i + 1}`, value));
    return request;
  }

  async query<R>(text: string, params: unknown[] = []): Promise<R[]> {
    return (await MssqlSampleDatabase.bindParams(this.pool.request(), params).query<R>(text)).recordset ?? [];
  }

  async transaction<T>(work: (tx: SampleTransaction) => Promise<T>): Promise<T> {
    const transaction = new this.mssql.Transaction(this.pool);
    await transaction.begin();
    try {
      const result = await work({
        handle: transaction,
        query: async <R>(text: string, params: unknown[] = []) =>
          (await MssqlSampleDatabase.bindParams(new this.mssql.Request(transaction), params).query<R>(text))
            .recordset ?? [],
      });
      await transaction.commit();
      return result;
    } catch (error) {
      await transaction.rollback().catch(() => undefined);
      throw error;
    }
  }

  isUniqueViolation(error: unknown): boolean {
    const e = error as { number?: unknown; originalError?: { info?: { number?: unknown } } } | null;
    const number = e?.number ?? e?.originalError?.info?.number;
    return number === 2627 || number === 2601;
  }

  close(): Promise<void> {
    return this.pool.close();
  }
}

/**
 * Opens the database the configuration names and creates the app's tables: PostgreSQL or SQL
 * Server from SQLQUEUE_URL, else an embedded PGlite in a local folder (zero setup).
 */
export async function openSampleDatabase(config: SampleConfig): Promise<SampleDatabase> {
  const logger = new Logger('SampleDatabase');
  if (!config.databaseUrl) {
    // Loaded only when used: the WASM build is large and a URL-configured app never needs it.
    const { PGlite } = await import('@electric-sql/pglite');
    if (config.dataDir !== 'memory://') await mkdir(config.dataDir, { recursive: true });
    const db = await PGlite.create(config.dataDir);
    logger.log(`embedded PostgreSQL (PGlite), data in ${config.dataDir}`);
    const database = new PGliteSampleDatabase(db, config.appSchema);
    await database.transaction(async (tx) => {
      for (const statement of database.sql.setup) await tx.query(statement);
    });
    return database;
  }
  if (config.dialect === 'postgres') {
    const pool = new pg.Pool({
      connectionString: config.databaseUrl,
      max: config.poolSize,
      connectionTimeoutMillis: 5_000,
      application_name: 'nestjs-sql-queue sample',
      // The queue shares this pool: a silently dead connection must fail, not hang a claim.
      keepAlive: true,
      keepAliveInitialDelayMillis: 10_000,
      query_timeout: 30_000,
    });
    // An idle connection that drops emits 'error' on the pool; unhandled, it would end the process.
    pool.on('error', (error) => logger.warn(`idle database connection failed: ${error.message}`));
    const database = new PgSampleDatabase(pool, config.appSchema);
    try {
      await database.transaction(async (tx) => {
        // Several replicas may boot at once; the DDL runs once at a time.
        await tx.query(database.sql.setupLock, [`sample-app:${config.appSchema}`]);
        for (const statement of database.sql.setup) await tx.query(statement);
      });
    } catch (error) {
      await pool.end().catch(() => undefined);
      throw error;
    }
    logger.log(`PostgreSQL at ${new URL(config.databaseUrl).host}`);
    return database;
  }
  const mssql = (await import('mssql')).default;
  const poolConfig = sampleMssqlConfig(config.databaseUrl, config.poolSize);
  const pool = new mssql.ConnectionPool(poolConfig);
  pool.on('error', (error: Error) => logger.warn(`idle database connection failed: ${error.message}`));
  await pool.connect();
  const database = new MssqlSampleDatabase(mssql, pool, config.appSchema);
  try {
    await database.transaction(async (tx) => {
      await tx.query(database.sql.setupLock, [`sample-app:${config.appSchema}`]);
      for (const statement of database.sql.setup) await tx.query(statement);
    });
  } catch (error) {
    await pool.close().catch(() => undefined);
    throw error;
  }
  logger.log(`SQL Server at ${poolConfig.server}`);
  return database;
}

/**
 * The SQL Server pool the app and the queue share, from SQLQUEUE_URL (an `mssql://` or
 * `sqlserver://` URL, or an ADO string) parsed as the queue parses its own `url`.
 */
export function sampleMssqlConfig(url: string, poolSize: number): SqlQueueMssqlUrlConfig {
  const parsed = mssqlConfigFromUrl(url, { poolSize });
  // As on PostgreSQL: an unreachable server fails the boot in seconds, unless the URL says otherwise.
  return { ...parsed, connectionTimeout: parsed.connectionTimeout ?? 5_000 };
}
