/**
 * The two SQL Server databases `npm run test:mssql` runs every file of this folder against
 * (review 2026-12-01, F1): one with READ_COMMITTED_SNAPSHOT off, the SQL Server default,
 * where READ COMMITTED reads take shared locks and wait for writers; one with it on (and
 * ALLOW_SNAPSHOT_ISOLATION on), the Azure SQL Database default, where they read row versions
 * and READPAST needs READCOMMITTEDLOCK. create-databases.sql creates both.
 *
 * Without the URLs each file skips in a moment; under SQLQUEUE_REQUIRE_MSSQL (set by
 * `npm run test:mssql`) a missing URL is a failing test instead, so CI cannot pass vacuously.
 */
import sql from 'mssql';
import { afterAll, beforeAll, describe, it } from 'vitest';
import { createMssqlStore } from '../../../lib/src/store/mssql/mssql.connect.js';
import { MSSQL_RCSI_URL, MSSQL_URL, uniqueSchema } from '../../helpers/databases.js';
import { beginCallerTransaction, dropMssqlSchema, mssqlRows } from '../../helpers/mssql.js';
import { bumpSchemaVersion, DATABASE_SETTINGS, unlockedJobs } from '../../helpers/mssql-test-queries.js';
import type { StoreTarget } from '../store-contract.js';

export interface MssqlDatabase {
  /** How test names tell the two apart. */
  label: 'RCSI off' | 'RCSI on';
  env: 'SQLQUEUE_MSSQL_URL' | 'SQLQUEUE_MSSQL_RCSI_URL';
  url: string;
  readCommittedSnapshot: boolean;
  /** ALLOW_SNAPSHOT_ISOLATION is required on (the SNAPSHOT tests run here only). */
  snapshotIsolation: boolean;
}

export const MSSQL_DATABASES: readonly MssqlDatabase[] = [
  {
    label: 'RCSI off',
    env: 'SQLQUEUE_MSSQL_URL',
    url: MSSQL_URL,
    readCommittedSnapshot: false,
    snapshotIsolation: false,
  },
  {
    label: 'RCSI on',
    env: 'SQLQUEUE_MSSQL_RCSI_URL',
    url: MSSQL_RCSI_URL,
    readCommittedSnapshot: true,
    snapshotIsolation: true,
  },
];

const REQUIRED = Boolean(process.env.SQLQUEUE_REQUIRE_MSSQL);

/**
 * Fails unless the database behind `db.url` has the settings its role needs: two URLs naming
 * the same database, or a database created without create-databases.sql, would otherwise run
 * the same half of the matrix twice and prove nothing about the other.
 */
export async function assertDatabaseRole(db: MssqlDatabase): Promise<void> {
  const [settings] = await mssqlRows<{ Database: string; ReadCommittedSnapshot: number; SnapshotIsolation: string }>(
    db.url,
    DATABASE_SETTINGS,
  );
  const rcsi = settings?.ReadCommittedSnapshot === 1;
  const snapshot = settings?.SnapshotIsolation === 'ON';
  if (rcsi !== db.readCommittedSnapshot || (db.snapshotIsolation && !snapshot)) {
    throw new Error(
      `${db.env} names database '${settings?.Database}' with READ_COMMITTED_SNAPSHOT ${rcsi ? 'ON' : 'OFF'} and ` +
        `ALLOW_SNAPSHOT_ISOLATION ${settings?.SnapshotIsolation}; it must have READ_COMMITTED_SNAPSHOT ` +
        `${db.readCommittedSnapshot ? 'ON' : 'OFF'}${db.snapshotIsolation ? ' and ALLOW_SNAPSHOT_ISOLATION ON' : ''}: ` +
        'run test/integration/mssql/create-databases.sql (docs/sql-server.md, "Running the contract suite against SQL Server")',
    );
  }
}

/** A test standing in for a database whose URL is not set: skipped, or failing when SQL Server is required. */
function missing(db: MssqlDatabase): void {
  it.skipIf(!REQUIRED)(`needs ${db.env} (npm run test:mssql)`, () => {
    throw new Error(
      `${db.env} is not set: point it at the ${db.label} database (docs/sql-server.md, "Running the contract suite against SQL Server")`,
    );
  });
}

/**
 * Declares `body` once per database, in a describe named after it. `where` keeps a part of
 * the plan to the databases it concerns (SNAPSHOT needs ALLOW_SNAPSHOT_ISOLATION).
 */
export function describeEachMssqlDatabase(
  title: string,
  body: (db: MssqlDatabase) => void,
  where: (db: MssqlDatabase) => boolean = () => true,
): void {
  for (const db of MSSQL_DATABASES.filter(where)) {
    describe(`${title} (SQL Server, ${db.label})`, () => {
      if (!db.url) return missing(db);
      beforeAll(() => assertDatabaseRole(db));
      body(db);
    });
  }
}

/**
 * A schema of its own on `db` for the tests of one describe: a migrated store (its own pool),
 * fresh queue names, and a count of a queue's rows that never waits. Registers the hooks.
 */
export function useMssqlSchema(db: MssqlDatabase, prefix: string, poolSize = 2) {
  const schema = uniqueSchema(prefix);
  const store = createMssqlStore({ url: db.url, poolSize }, { schema });
  let queueSeq = 0;
  beforeAll(() => store.migrate('auto'));
  afterAll(async () => {
    await store.close();
    await dropMssqlSchema(db.url, schema);
  });
  return {
    schema,
    store,
    newQueue: (label: string) => `${label}.${++queueSeq}`,
    /** Rows of the queue no session holds a lock on: all of them, once every transaction has ended. */
    async unlocked(queue: string): Promise<number> {
      const [row] = await mssqlRows<{ Unlocked: string }>(db.url, unlockedJobs(schema), (r) =>
        r.input('queue', sql.NVarChar(128), queue),
      );
      return Number(row!.Unlocked);
    },
  };
}

/** The store contract's view of one database (store-contract.ts). */
export function mssqlStoreTarget(db: MssqlDatabase): StoreTarget {
  return {
    name: `mssql ${db.label}`,
    concurrentSessions: true,
    scale: 1,
    async openStore(schema, options) {
      return createMssqlStore({ url: db.url, poolSize: options?.poolSize ?? 4 }, { schema });
    },
    async beginTransaction() {
      const caller = await beginCallerTransaction(db.url);
      return {
        handle: caller.transaction,
        async commit() {
          try {
            await caller.commit();
          } finally {
            await caller.close();
          }
        },
        rollback: () => caller.close(),
      };
    },
    dropSchema: (schema) => dropMssqlSchema(db.url, schema),
    async bumpSchemaVersion(schema, version) {
      await mssqlRows(db.url, bumpSchemaVersion(schema), (r) => r.input('version', sql.Int, version));
    },
  };
}
