import pg from 'pg';
import { payload, perSecond, runConcurrently } from './common.js';

/**
 * The reference every figure is compared with, measured in the same run: what a competent
 * hand-written queue on plain `pg` does. Its table has what any queue needs (state, payload,
 * priority, run-at, claim token, lease) and one partial index for the claim; no history, no
 * idempotency, no retries, no heartbeats. That is the database's own speed for this work.
 */
export class RawReference {
  private constructor(
    private readonly pool: pg.Pool,
    private readonly table: string,
  ) {}

  static async open(url: string, schema: string, poolSize = 20): Promise<RawReference> {
    const pool = new pg.Pool({ connectionString: url, max: poolSize });
    const table = `"${schema}".raw_jobs`;
    await pool.query(`CREATE SCHEMA IF NOT EXISTS "${schema}"`);
    await pool.query(`CREATE TABLE ${table} (
      id bigserial PRIMARY KEY, queue text NOT NULL, state text NOT NULL DEFAULT 'ready', payload jsonb NOT NULL,
      priority int NOT NULL DEFAULT 0, run_at timestamptz NOT NULL DEFAULT now(), claim_token uuid, lease_until timestamptz)`);
    await pool.query(`CREATE INDEX ON ${table} (queue, priority DESC, run_at, id) WHERE state = 'ready'`);
    return new RawReference(pool, table);
  }

  async close(): Promise<void> {
    await this.pool.end();
  }

  /** One INSERT per job, `concurrency` clients at once. */
  async singleInserts(total: number, concurrency: number): Promise<number> {
    const started = performance.now();
    await runConcurrently(concurrency, total, async (i) => {
      await this.pool.query(`INSERT INTO ${this.table} (queue, payload) VALUES ($1, $2::jsonb)`, [
        'raw',
        JSON.stringify(payload(i)),
      ]);
    });
    return perSecond(total, performance.now() - started);
  }

  /** One INSERT of `batch` rows per statement. */
  async bulkInserts(total: number, batch: number): Promise<number> {
    const started = performance.now();
    for (let done = 0; done < total; done += batch) {
      const rows = Array.from({ length: Math.min(batch, total - done) }, (_, k) => JSON.stringify(payload(done + k)));
      await this.pool.query(
        `INSERT INTO ${this.table} (queue, payload) SELECT 'raw-bulk', p FROM unnest($1::jsonb[]) AS p`,
        [rows],
      );
    }
    return perSecond(total, performance.now() - started);
  }

  /**
   * Drains `total` pre-inserted jobs with one connection: claim `limit` rows with
   * FOR UPDATE SKIP LOCKED, then complete them (token-checked) in one statement.
   */
  async drain(total: number, limit: number): Promise<number> {
    const queue = `raw-drain-${limit}`;
    await this.pool.query(
      `INSERT INTO ${this.table} (queue, payload) SELECT $1, jsonb_build_object('orderId', g) FROM generate_series(1, $2) g`,
      [queue, total],
    );
    const client = await this.pool.connect();
    try {
      const started = performance.now();
      let done = 0;
      for (;;) {
        const claimed = await client.query<{ id: string; claim_token: string }>(
          `UPDATE ${this.table} SET state = 'leased', claim_token = gen_random_uuid(), lease_until = now() + interval '30 seconds'
           WHERE id IN (SELECT id FROM ${this.table} WHERE queue = $1 AND state = 'ready'
                        ORDER BY priority DESC, run_at, id LIMIT $2 FOR UPDATE SKIP LOCKED)
           RETURNING id, claim_token, payload`,
          [queue, limit],
        );
        if (claimed.rows.length === 0) break;
        if (limit === 1) {
          await client.query(
            `UPDATE ${this.table} SET state = 'done' WHERE id = $1 AND claim_token = $2 AND state = 'leased'`,
            [claimed.rows[0]!.id, claimed.rows[0]!.claim_token],
          );
        } else {
          await client.query(
            `UPDATE ${this.table} AS j SET state = 'done' FROM unnest($1::bigint[], $2::uuid[]) AS c(id, token)
             WHERE j.id = c.id AND j.claim_token = c.token AND j.state = 'leased'`,
            [claimed.rows.map((r) => r.id), claimed.rows.map((r) => r.claim_token)],
          );
        }
        done += claimed.rows.length;
      }
      return perSecond(done, performance.now() - started);
    } finally {
      client.release();
    }
  }
}
