import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { createPostgresStore } from '../../lib/src/store/postgres/postgres.connect.js';
import { PG_LATEST_VERSION } from '../../lib/src/store/postgres/postgres.migrations.js';
import { dropPgSchema, PG_URL, sql, uniqueSchema } from '../helpers/databases.js';
import { maxAttemptsAfterRecording } from '../helpers/queue-settings.js';

// An application role with DML rights only, on a schema a DBA installed and keeps current.
const schema = uniqueSchema('rvpriv');
const role = `rv_app_${randomBytes(4).toString('hex')}`;
const appUrl = PG_URL.replace('postgres://postgres@', `postgres://${role}:pw@`);

beforeAll(async () => {
  const admin = createPostgresStore({ url: PG_URL, poolSize: 1 }, { schema });
  await admin.migrate('auto');
  await admin.close();
  await sql(PG_URL, `CREATE ROLE ${role} LOGIN PASSWORD 'pw'`);
  await sql(PG_URL, `GRANT USAGE ON SCHEMA "${schema}" TO ${role}`);
  await sql(PG_URL, `GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "${schema}" TO ${role}`);
  await sql(PG_URL, `GRANT USAGE, UPDATE ON ALL SEQUENCES IN SCHEMA "${schema}" TO ${role}`);
});
afterAll(async () => {
  await dropPgSchema(schema);
  await sql(PG_URL, `DROP ROLE IF EXISTS ${role}`);
});

it("migrations 'auto' on an up-to-date schema needs no DDL rights (nothing to install)", async () => {
  const store = createPostgresStore({ url: appUrl, poolSize: 1 }, { schema });
  try {
    await expect(store.migrate('check')).resolves.toMatchObject({ current: PG_LATEST_VERSION });
    await expect(store.migrate('auto')).resolves.toMatchObject({ current: PG_LATEST_VERSION });
    // What a consumer and a producer do at run time needs no more than DML either.
    expect(await maxAttemptsAfterRecording(store, 'priv.q', 4)).toBe(4);
  } finally {
    await store.close();
  }
});
