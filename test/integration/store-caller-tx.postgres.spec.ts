import pg from 'pg';
import { expect, it } from 'vitest';
import { SqlQueueValidationError } from '../../lib/src/core/errors.js';
import { prepareJob } from '../../lib/src/core/producer/job-validation.js';
import { PG_URL } from '../helpers/databases.js';
import { migratedPgStore } from '../helpers/pg-store.js';

const LIMITS = { maxPayloadBytes: 1024 * 1024, defaultMaxAttempts: 3 };
const db = migratedPgStore('callertx', 1);

it('a pg client with no open transaction is refused, like a pool (it would commit the job on its own)', async () => {
  const client = new pg.Client({ connectionString: PG_URL });
  await client.connect();
  try {
    // The caller forgot BEGIN: "rolling back" afterwards cannot take the job back.
    const attempt = db.store.enqueue([prepareJob('q', { x: 1 }, {}, LIMITS)], client).catch((e: unknown) => e);
    const outcome = await attempt;
    await client.query('ROLLBACK').catch(() => undefined);
    expect(outcome).toBeInstanceOf(SqlQueueValidationError);
    expect((await db.store.stats('q')).ready).toBe(0);
  } finally {
    await client.end();
  }
});
