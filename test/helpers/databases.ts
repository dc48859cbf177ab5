import { randomBytes } from 'node:crypto';
import pg from 'pg';

/** The local PostgreSQL every CI run has; override with SQLQUEUE_PG_URL. */
export const PG_URL = process.env.SQLQUEUE_PG_URL ?? 'postgres://postgres@127.0.0.1:5432/test';

/**
 * SQL Server, absent on most machines (`npm run test:mssql` needs both): a database with
 * READ_COMMITTED_SNAPSHOT off (the SQL Server default) and one with it on (the Azure SQL
 * default), on the same server or not. See docs/sql-server.md, "Running the contract suite against SQL Server".
 */
export const MSSQL_URL = process.env.SQLQUEUE_MSSQL_URL ?? '';
export const MSSQL_RCSI_URL = process.env.SQLQUEUE_MSSQL_RCSI_URL ?? '';

/** Each test file works in its own schema, so files can run in parallel against one database. */
export function uniqueSchema(prefix: string): string {
  return `t_${prefix}_${randomBytes(4).toString('hex')}`;
}

/** One statement on a connection of its own (a test's view of the database, not the library's). */
export async function sql<R extends Record<string, unknown>>(url: string, text: string, params: unknown[] = []) {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    return (await client.query<R>(text, params)).rows;
  } finally {
    await client.end();
  }
}

export async function dropPgSchema(schema: string, url = PG_URL): Promise<void> {
  await sql(url, `DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
}
