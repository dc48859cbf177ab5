import pg from 'pg';
import { afterAll, expect, it } from 'vitest';
import { createPostgresStore } from '../../lib/src/store/postgres/postgres.connect.js';
import { PG_MIGRATIONS, pgBootstrap } from '../../lib/src/store/postgres/postgres.migrations.js';
import { prepareJob } from '../../lib/src/core/producer/job-validation.js';
import { dropPgSchema, PG_URL, sql, uniqueSchema } from '../helpers/databases.js';

/**
 * Job control's schema (issue 23) arrives on a database with jobs in flight: a schema at
 * version 7 (the release before it), with ready, delayed, grouped and leased jobs, upgrades
 * under migrations 'auto' without losing any. The leased job's owner completes it with the token
 * it was claimed with, and the upgraded queue can be paused.
 */
const schema = uniqueSchema('ctlmig');
const store = createPostgresStore({ url: PG_URL, poolSize: 2 }, { schema });
afterAll(async () => {
  await store.close();
  await dropPgSchema(schema);
});

const LIMITS = { maxPayloadBytes: 1024, defaultMaxAttempts: 5 };

it("a version-7 schema with jobs in flight upgrades under 'auto': every job kept, a leased one completes with its token, and pausing works", async () => {
  const client = new pg.Client({ connectionString: PG_URL });
  await client.connect();
  try {
    for (const statement of [
      ...pgBootstrap(schema),
      ...PG_MIGRATIONS.filter((m) => m.version <= 7).flatMap((m) => m.statements(schema)),
      ...PG_MIGRATIONS.filter((m) => m.version <= 7).map(
        (m) => `INSERT INTO "${schema}".schema_version (version, description) VALUES (${m.version}, 'before')`,
      ),
    ]) {
      await client.query(statement);
    }
  } finally {
    await client.end();
  }
  // Jobs as version 7 holds them: the enqueue statements have not changed since.
  const old = createPostgresStore({ url: PG_URL, poolSize: 1 }, { schema });
  await old.enqueue([
    prepareJob('upgrade', { n: 1 }, {}, LIMITS),
    prepareJob('upgrade', { n: 2 }, { delayMs: 3_600_000 }, LIMITS),
    prepareJob('upgrade', { n: 3 }, { groupKey: 'g' }, LIMITS),
    prepareJob('upgrade', { n: 4 }, { groupKey: 'g' }, LIMITS),
    prepareJob('upgrade', { n: 5 }, {}, LIMITS),
  ]);
  const [leased] = await sql<{ id: string; claim_token: string }>(
    PG_URL,
    `UPDATE "${schema}".jobs SET state = 'leased', claim_token = gen_random_uuid(), attempts = 1,
            lease_until = now() + interval '1 hour', claimed_at = now(), worker_id = 'old-release'
     WHERE id = (SELECT min(id) FROM "${schema}".jobs WHERE group_key IS NULL AND run_at <= now())
     RETURNING id::text AS id, claim_token::text AS claim_token`,
  );
  await old.close();
  const before = await sql<{ id: string; state: string }>(
    PG_URL,
    `SELECT id::text AS id, state FROM "${schema}".jobs ORDER BY id`,
  );

  const status = await store.migrate('auto');
  expect(status.current).toBe(status.latest);
  expect(status.latest).toBeGreaterThan(7);
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
