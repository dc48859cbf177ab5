import sql from 'mssql';
import { mssqlConfigFromUrl } from '../../lib/src/store/mssql/mssql.config.js';
import {
  MSSQL_MIGRATIONS,
  mssqlBootstrap,
  mssqlDropSchema,
  mssqlRecordVersion,
} from '../../lib/src/store/mssql/mssql.migrations.js';
import { SESSION_STATE } from './mssql-test-queries.js';

/**
 * A test's own connections to SQL Server, opened from the same URLs as the store's (through
 * the library's URL parser). Loaded by the worker processes too, so no vitest here.
 */
export function mssqlPoolConfig(url: string, poolSize: number): sql.config {
  return mssqlConfigFromUrl(url, { poolSize }) as sql.config;
}

export async function openMssqlPool(url: string, poolSize = 1): Promise<sql.ConnectionPool> {
  const pool = new sql.ConnectionPool(mssqlPoolConfig(url, poolSize));
  // An idle connection's error must not be an unhandled 'error' event in a test process.
  pool.on('error', () => undefined);
  return pool.connect();
}

/** Binds one request's parameters; `sql.Request.input` takes a type factory or an instance. */
export type MssqlBind = (request: sql.Request) => sql.Request;

/** Runs `work` on a pool of its own and closes it, whatever happens. */
export async function withMssqlPool<T>(
  url: string,
  work: (pool: sql.ConnectionPool) => Promise<T>,
  poolSize = 1,
): Promise<T> {
  const pool = await openMssqlPool(url, poolSize);
  try {
    return await work(pool);
  } finally {
    await pool.close();
  }
}

/** One statement (sp_executesql) on a connection of its own: a test's view of the database. */
export async function mssqlRows<R>(url: string, text: string, bind: MssqlBind = (r) => r): Promise<R[]> {
  return withMssqlPool(url, async (pool) => (await bind(pool.request()).query<R>(text)).recordset ?? []);
}

/** Drops every object the migrations (and the tests) created in a schema, then the schema. */
export async function dropMssqlSchema(url: string, schema: string): Promise<void> {
  await withMssqlPool(url, (pool) =>
    pool.request().input('schema', sql.NVarChar(128), schema).batch(mssqlDropSchema()),
  );
}

/** The SQL Server error number of a failed request (mssql wraps tedious's error). */
export function mssqlErrorNumber(error: unknown): number | undefined {
  const candidate = error as { number?: unknown; originalError?: { info?: { number?: unknown } } } | null;
  const value = candidate?.number ?? candidate?.originalError?.info?.number;
  return typeof value === 'number' ? value : undefined;
}

/** `promise`, its rejection reworded to lead with the SQL Server error number (1205, 650, 2601…). */
export async function withErrorNumber<T>(promise: Promise<T>, what: string): Promise<T> {
  try {
    return await promise;
  } catch (error) {
    const number = mssqlErrorNumber(error);
    throw new Error(
      `${what} failed${number === undefined ? '' : ` with SQL Server error ${number}`}: ${(error as Error).message}`,
      {
        cause: error,
      },
    );
  }
}

/** A caller's transaction on a connection of its own, as an application would open one. */
export interface CallerTransaction {
  transaction: sql.Transaction;
  /** The session the transaction runs on (for sys.dm_tran_locks). */
  spid(): Promise<number>;
  commit(): Promise<void>;
  /** Rolls back if still open, and closes the connection; safe to call more than once. */
  close(): Promise<void>;
}

export async function beginCallerTransaction(
  url: string,
  isolation: sql.IIsolationLevel = sql.ISOLATION_LEVEL.READ_COMMITTED,
): Promise<CallerTransaction> {
  const pool = await openMssqlPool(url, 1);
  const transaction = new sql.Transaction(pool);
  await transaction.begin(isolation);
  let open = true;
  let closed = false;
  return {
    transaction,
    async spid() {
      const result = await new sql.Request(transaction).query<{ Spid: number }>(SESSION_STATE);
      return result.recordset[0]!.Spid;
    },
    async commit() {
      open = false;
      await transaction.commit();
    },
    async close() {
      if (open) {
        open = false;
        // A deadlock victim's transaction is already rolled back by the server.
        await transaction.rollback().catch(() => undefined);
      }
      if (!closed) {
        closed = true;
        await pool.close();
      }
    },
  };
}

/** Installs `schema` up to `version` (a previous release's schema), in one transaction, as migrate() would have. */
export async function installMssqlSchemaUpTo(pool: sql.ConnectionPool, schema: string, version: number): Promise<void> {
  const transaction = new sql.Transaction(pool);
  await transaction.begin(sql.ISOLATION_LEVEL.READ_COMMITTED);
  try {
    for (const batch of mssqlBootstrap(schema)) await new sql.Request(transaction).batch(batch);
    for (const migration of MSSQL_MIGRATIONS.filter((m) => m.version <= version)) {
      for (const batch of migration.batches(schema)) await new sql.Request(transaction).batch(batch);
      await new sql.Request(transaction)
        .input('version', sql.Int, migration.version)
        .input('description', sql.NVarChar(400), migration.description)
        .query(mssqlRecordVersion(schema));
    }
    await transaction.commit();
  } catch (error) {
    await transaction.rollback().catch(() => undefined);
    throw error;
  }
}
