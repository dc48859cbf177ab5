/**
 * The connection hygiene of a transactional handler's mssql transaction (review finding 1 and 3
 * of issue 25): what is done with mssql's Transaction and its tedious connection when a rollback
 * meets a request still running, or a commit or rollback fails. mssql's own behaviour (EREQINPROG,
 * releasing the connection to the pool in a failed commit's callback) is read from its source;
 * the live suite runs the mid-request rollback on a real server (store-handler-transaction.ts).
 */
import type sql from 'mssql';
import { describe, expect, it } from 'vitest';
import {
  connectionOf,
  discardIfStillInTransaction,
  rollbackOrClose,
  type HandlerConnection,
} from '../../lib/src/store/mssql/mssql.handler-connection.js';

function fakeConnection(inTransaction = true): HandlerConnection & { closes: number } {
  return {
    closed: false,
    hasError: false,
    inTransaction,
    closes: 0,
    close() {
      this.closes++;
      this.closed = true;
    },
  };
}

function refusal(code: string): Error {
  return Object.assign(new Error(code), { code });
}

describe('a transactional handler’s mssql connection', () => {
  it('finds the connection a begun transaction holds, and none in an unknown shape', () => {
    const connection = fakeConnection();
    expect(connectionOf({ _acquiredConnection: connection } as unknown as sql.Transaction)).toBe(connection);
    expect(connectionOf({} as unknown as sql.Transaction)).toBeNull();
    expect(connectionOf({ _acquiredConnection: { id: 1 } } as unknown as sql.Transaction)).toBeNull();
  });

  it('a rollback that meets a running request closes the connection and asks again until mssql lets go', async () => {
    const connection = fakeConnection();
    const calls: string[] = [];
    const transaction = {
      async rollback() {
        // mssql refuses while the request runs; the request fails once its connection is closed.
        if (!connection.closed) {
          calls.push('refused');
          throw refusal('EREQINPROG');
        }
        calls.push('rolled back');
      },
    } as unknown as sql.Transaction;
    await rollbackOrClose(transaction, connection);
    expect(calls).toEqual(['refused', 'rolled back']);
    expect(connection.closes).toBe(1);
  });

  it('a rollback that fails otherwise never throws, and marks a connection still in its transaction', async () => {
    const stillOpen = fakeConnection(true);
    await rollbackOrClose(
      {
        rollback: async () => {
          throw refusal('ETIMEOUT');
        },
      } as unknown as sql.Transaction,
      stillOpen,
    );
    expect(stillOpen.hasError).toBe(true);
    expect(stillOpen.closes).toBe(0);

    // Rolled back by the server already (a deadlock victim): its connection is sound and in the pool.
    const rolledBack = fakeConnection(false);
    await rollbackOrClose(
      {
        rollback: async () => {
          throw refusal('EABORT');
        },
      } as unknown as sql.Transaction,
      rolledBack,
    );
    expect(rolledBack.hasError).toBe(false);
  });

  it('after a failed commit, only a connection the server still has in a transaction is discarded', () => {
    const open = fakeConnection(true);
    discardIfStillInTransaction(open);
    expect(open.hasError).toBe(true);
    const ended = fakeConnection(false);
    discardIfStillInTransaction(ended);
    expect(ended.hasError).toBe(false);
    const closed = fakeConnection(true);
    closed.close();
    discardIfStillInTransaction(closed);
    expect(closed.hasError).toBe(false);
    discardIfStillInTransaction(null);
  });
});
