import { afterAll, beforeAll } from 'vitest';
import { createPostgresStore } from '../../lib/src/store/postgres/postgres.connect.js';
import type { PostgresQueueStore } from '../../lib/src/store/postgres/postgres.store.js';
import { dropPgSchema, PG_URL, uniqueSchema } from './databases.js';

/**
 * A migrated PostgreSQL store in a schema of its own for the test file: opened before its tests,
 * closed and dropped after them. Read `.store` inside tests (it exists once beforeAll ran).
 */
export function migratedPgStore(
  prefix: string,
  poolSize = 2,
): { readonly schema: string; readonly store: PostgresQueueStore } {
  const schema = uniqueSchema(prefix);
  let store: PostgresQueueStore | undefined;
  beforeAll(async () => {
    store = createPostgresStore({ url: PG_URL, poolSize }, { schema });
    await store.migrate('auto');
  });
  afterAll(async () => {
    await store?.close();
    await dropPgSchema(schema);
  });
  return {
    schema,
    get store() {
      if (!store) throw new Error('the store opens in beforeAll: use it inside a test');
      return store;
    },
  };
}
