/**
 * The idempotent receiver the worker processes write business effects to, as a user would
 * write one, on the same database as the queue: a table keyed by the job's idempotency key
 * (the effect, at most once), a log of every handler start, and a log of every attempt to
 * write the effect, committed with the effect itself.
 */
import sql from 'mssql';
import pg from 'pg';
import { openMssqlPool } from '../helpers/mssql.js';
import { recordRun, writeEffect } from '../helpers/mssql-test-queries.js';

export interface EffectsReceiver {
  recordRun(jobId: string, pid: number, attempt: number): Promise<void>;
  /** Writes the key's effect unless it is there already; true when this call applied it. */
  writeEffect(key: string, jobId: string, pid: number, attempt: number): Promise<boolean>;
  close(): Promise<void>;
}

function postgresReceiver(url: string, schema: string): EffectsReceiver {
  const pool = new pg.Pool({ connectionString: url, max: 4 });
  pool.on('error', () => undefined);
  return {
    async recordRun(jobId, pid, attempt) {
      await pool.query(`INSERT INTO "${schema}".runs (job_id, pid, attempt) VALUES ($1, $2, $3)`, [
        jobId,
        pid,
        attempt,
      ]);
    },
    async writeEffect(key, jobId, pid, attempt) {
      // One statement, so the effect and its log row commit together even if the process dies.
      const result = await pool.query<{ applied: boolean }>(
        `WITH applied AS (
           INSERT INTO "${schema}".effects (idempotency_key, job_id, pid) VALUES ($1, $2, $3)
           ON CONFLICT (idempotency_key) DO NOTHING RETURNING 1
         )
         INSERT INTO "${schema}".effect_writes (idempotency_key, job_id, pid, attempt, applied)
         SELECT $1, $2, $3, $4, EXISTS (SELECT 1 FROM applied)
         RETURNING applied`,
        [key, jobId, pid, attempt],
      );
      return result.rows[0]?.applied === true;
    },
    close: () => pool.end(),
  };
}

function mssqlReceiver(url: string, schema: string): EffectsReceiver {
  const opening = openMssqlPool(url, 4);
  // Awaited by every call; a failed connect must not also end the process as an unhandled rejection.
  opening.catch(() => undefined);
  const statements = { recordRun: recordRun(schema), writeEffect: writeEffect(schema) };
  return {
    async recordRun(jobId, pid, attempt) {
      const pool = await opening;
      await pool
        .request()
        .input('jobId', sql.BigInt, jobId)
        .input('pid', sql.Int, pid)
        .input('attempt', sql.Int, attempt)
        .query(statements.recordRun);
    },
    async writeEffect(key, jobId, pid, attempt) {
      const pool = await opening;
      const result = await pool
        .request()
        .input('key', sql.NVarChar(255), key)
        .input('jobId', sql.BigInt, jobId)
        .input('pid', sql.Int, pid)
        .input('attempt', sql.Int, attempt)
        .query<{ Applied: boolean }>(statements.writeEffect);
      return result.recordset[0]?.Applied === true;
    },
    close: async () => (await opening).close(),
  };
}

export function openEffectsReceiver(dialect: 'postgres' | 'mssql', url: string, schema: string): EffectsReceiver {
  return dialect === 'mssql' ? mssqlReceiver(url, schema) : postgresReceiver(url, schema);
}
