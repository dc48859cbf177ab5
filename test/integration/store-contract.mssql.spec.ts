import sql from 'mssql';
import { describe, it } from 'vitest';
import { mssqlConfigFromUrl } from '../../lib/src/store/mssql/mssql.config.js';
import { createMssqlStore } from '../../lib/src/store/mssql/mssql.connect.js';
import { mssqlDropSchema } from '../../lib/src/store/mssql/mssql.migrations.js';
import { MSSQL_URL } from '../helpers/databases.js';
import { describeStoreContract } from './store-contract.js';

/** Drops every object the migrations create in a test schema, then the schema. */
async function dropMssqlSchema(schema: string): Promise<void> {
  const pool = await new sql.ConnectionPool(mssqlConfigFromUrl(MSSQL_URL, { poolSize: 2 })).connect();
  try {
    await pool.request().input('schema', sql.NVarChar(128), schema).batch(mssqlDropSchema());
  } finally {
    await pool.close();
  }
}

if (!MSSQL_URL) {
  describe('QueueStore contract: mssql', () => {
    it.skipIf(!process.env.SQLQUEUE_REQUIRE_MSSQL)('needs SQLQUEUE_MSSQL_URL (npm run test:mssql)', () => {
      throw new Error('SQLQUEUE_MSSQL_URL is not set: point it at a SQL Server (see README, "SQL Server setup")');
    });
  });
} else {
  describeStoreContract({
    name: 'mssql',
    concurrentSessions: true,
    scale: 1,
    async openStore(schema, options) {
      return createMssqlStore({ url: MSSQL_URL, poolSize: options?.poolSize ?? 4 }, { schema });
    },
    async beginTransaction() {
      const pool = await new sql.ConnectionPool(mssqlConfigFromUrl(MSSQL_URL, { poolSize: 1 })).connect();
      const transaction = new sql.Transaction(pool);
      await transaction.begin();
      const finish = async (work: () => Promise<void>) => {
        try {
          await work();
        } finally {
          await pool.close();
        }
      };
      return {
        handle: transaction,
        commit: () => finish(() => transaction.commit()),
        rollback: () => finish(() => transaction.rollback()),
      };
    },
    dropSchema: dropMssqlSchema,
    async bumpSchemaVersion(schema, version) {
      const pool = await new sql.ConnectionPool(mssqlConfigFromUrl(MSSQL_URL, { poolSize: 1 })).connect();
      try {
        await pool
          .request()
          .input('version', sql.Int, version)
          .query(
            `INSERT INTO [${schema}].[SchemaVersion] ([Version], [Description]) VALUES (@version, N'from the future');`,
          );
      } finally {
        await pool.close();
      }
    },
  });
}
