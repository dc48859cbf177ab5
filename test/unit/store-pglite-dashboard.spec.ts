import { PGlite } from '@electric-sql/pglite';
import type { SqlQueuePGlite } from '../../lib/src/store/driver-shapes.js';
import { createPostgresStore } from '../../lib/src/store/postgres/postgres.connect.js';
import { describeStoreContract, type StoreTarget } from '../integration/store-contract.js';
import { describeFlowContract } from '../integration/store-flow-contract.js';
import { describeHandlerTransactionContract } from '../integration/store-handler-transaction.js';

/**
 * The store contract on PGlite, the embedded PostgreSQL a zero-setup app (and the sample app's
 * dashboard) runs on: the dashboard's reads above all, whose statements differ most from the
 * rest (recursive walks, materialized CTEs). The whole contract takes a few seconds here, so it
 * all runs. One PGlite session serves every store of the contract.
 */
const db = await PGlite.create();

/** A store's own handle on the shared database: closing the store closes it, as with a pool of its own. */
function session(): SqlQueuePGlite {
  let closed = false;
  const open = () => {
    if (closed) throw new Error('this store was closed');
    return db;
  };
  return {
    query: (text, params) => open().query(text, params),
    transaction: (callback) => open().transaction(callback),
    listen: (channel, callback) => open().listen(channel, callback),
    close: async () => {
      closed = true;
    },
  };
}

const target: StoreTarget = {
  name: 'pglite',
  concurrentSessions: false,
  scale: 1,
  async openStore(schema) {
    return createPostgresStore({ pglite: session(), ownsDb: true }, { schema });
  },
  async beginTransaction() {
    // PGlite's transaction lives inside a callback: held open until the test commits or rolls back.
    let finish!: (commit: boolean) => void;
    let handle: unknown;
    let done!: Promise<unknown>;
    await new Promise<void>((opened) => {
      done = db.transaction(async (tx) => {
        handle = tx;
        opened();
        if (!(await new Promise<boolean>((resolve) => (finish = resolve)))) await tx.rollback();
      });
    });
    const end = async (commit: boolean) => {
      finish(commit);
      await done;
    };
    return { handle, commit: () => end(true), rollback: () => end(false) };
  },
  async dropSchema(schema) {
    await db.exec(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
  },
  async bumpSchemaVersion(schema, version) {
    await db.query(`INSERT INTO "${schema}".schema_version (version, description) VALUES ($1, 'from the future')`, [
      version,
    ]);
  },
};
describeStoreContract(target);
describeFlowContract(target);
describeHandlerTransactionContract(target);
