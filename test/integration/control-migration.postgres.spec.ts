import pg from 'pg';
import { afterAll, expect, it } from 'vitest';
import { createPostgresStore } from '../../lib/src/store/postgres/postgres.connect.js';
import { PG_MIGRATIONS, pgBootstrap } from '../../lib/src/store/postgres/postgres.migrations.js';
import type { QueueStore } from '../../lib/src/core/queue-store.js';
import { dropPgSchema, PG_URL, sql, uniqueSchema } from '../helpers/databases.js';

/**
 * Job control's schema (issue 23, from version 7) and flow control's (issue 24, from version 10,
 * which rebuilds the claim index) arrive on a database with jobs in flight: ready, delayed,
 * grouped and leased jobs upgrade under migrations 'auto' without losing any. The leased job's owner completes it with the token
 * it was claimed with, and the upgraded queue can be paused.
 */
const schemas: string[] = [];
const stores: QueueStore[] = [];
afterAll(async () => {
  await Promise.all(stores.map((store) => store.close()));
  for (const schema of schemas) await dropPgSchema(schema);
});

for (const from of [7, 10]) {
  it(`a version-${from} schema with jobs in flight upgrades under 'auto': every job kept, a leased one completes with its token, and pausing works`, async () => {
    const schema = uniqueSchema(`ctlmig${from}`);
    schemas.push(schema);
    const store = createPostgresStore({ url: PG_URL, poolSize: 2 }, { schema });
    stores.push(store);
    const client = new pg.Client({ connectionString: PG_URL });
    await client.connect();
    try {
      for (const statement of [
        ...pgBootstrap(schema),
        ...PG_MIGRATIONS.filter((m) => m.version <= from).flatMap((m) => m.statements(schema)),
        ...PG_MIGRATIONS.filter((m) => m.version <= from).map(
          (m) => `INSERT INTO "${schema}".schema_version (version, description) VALUES (${m.version}, 'before')`,
        ),
      ]) {
        await client.query(statement);
      }
      // Jobs as that version's release wrote them (its columns only): two ready, one delayed,
      // an ordered group of two with its group row, and a leased one.
      await client.query(
        `INSERT INTO "${schema}".jobs (queue, state, payload, run_at, group_key, max_attempts) VALUES
           ('upgrade', 'ready', '{"n": 1}', now(), NULL, 5),
           ('upgrade', 'delayed', '{"n": 2}', now() + interval '1 hour', NULL, 5),
           ('upgrade', 'ready', '{"n": 3}', now(), 'g', 5),
           ('upgrade', 'ready', '{"n": 4}', now(), 'g', 5),
           ('upgrade', 'ready', '{"n": 5}', now(), NULL, 5)`,
      );
      await client.query(
        `INSERT INTO "${schema}".groups (queue, group_key, head_id, head_ready_at, head_priority)
         SELECT queue, group_key, min(id), now(), 0 FROM "${schema}".jobs WHERE group_key IS NOT NULL
         GROUP BY queue, group_key`,
      );
    } finally {
      await client.end();
    }
    const [leased] = await sql<{ id: string; claim_token: string }>(
      PG_URL,
      `UPDATE "${schema}".jobs SET state = 'leased', claim_token = gen_random_uuid(), attempts = 1,
              lease_until = now() + interval '1 hour', claimed_at = now(), worker_id = 'old-release'
       WHERE id = (SELECT min(id) FROM "${schema}".jobs WHERE group_key IS NULL AND run_at <= now())
       RETURNING id::text AS id, claim_token::text AS claim_token`,
    );
    const before = await sql<{ id: string; state: string }>(
      PG_URL,
      `SELECT id::text AS id, state FROM "${schema}".jobs ORDER BY id`,
    );

    const status = await store.migrate('auto');
    expect(status.current).toBe(status.latest);
    expect(status.latest).toBeGreaterThan(from);
    expect(await sql(PG_URL, `SELECT id::text AS id, state FROM "${schema}".jobs ORDER BY id`)).toEqual(before);
    expect(await store.complete([{ id: leased!.id, claimToken: leased!.claim_token }])).toEqual([
      { id: leased!.id, outcome: 'ok' },
    ]);

    expect(await store.pauseQueue('upgrade', 'after the upgrade')).toBe(true);
    expect(await store.claim({ queue: 'upgrade', limit: 10, leaseMs: 30_000, workerId: 'new' })).toEqual([]);
    await store.resumeQueue('upgrade');
    const claimed = await store.claim({ queue: 'upgrade', limit: 10, leaseMs: 30_000, workerId: 'new' });
    // The ungrouped ready job and the group's head; the delayed one is not due.
    expect(claimed.map((c) => (c.payload as { n: number }).n).sort()).toEqual([3, 5]);
  });
}
