import pg from 'pg';
import { createPostgresStore } from '../../lib/src/store/postgres/postgres.connect.js';
import { dropPgSchema, PG_URL, sql } from '../helpers/databases.js';
import { describeStoreContract } from './store-contract.js';

describeStoreContract({
  name: 'postgres',
  concurrentSessions: true,
  scale: 1,
  async openStore(schema, options) {
    return createPostgresStore({ url: PG_URL, poolSize: options?.poolSize ?? 4 }, { schema });
  },
  async beginTransaction() {
    const client = new pg.Client({ connectionString: PG_URL });
    await client.connect();
    await client.query('BEGIN');
    const finish = async (command: string) => {
      try {
        await client.query(command);
      } finally {
        await client.end();
      }
    };
    return { handle: client, commit: () => finish('COMMIT'), rollback: () => finish('ROLLBACK') };
  },
  dropSchema: (schema) => dropPgSchema(schema),
  async bumpSchemaVersion(schema, version) {
    await sql(PG_URL, `INSERT INTO "${schema}".schema_version (version, description) VALUES ($1, 'from the future')`, [
      version,
    ]);
  },
});
