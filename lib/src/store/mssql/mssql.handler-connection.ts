import type sql from 'mssql';

/**
 * What a transactional handler's transaction needs of its tedious connection, which mssql keeps
 * in the Transaction's private `_acquiredConnection` while the transaction holds it (mssql 12).
 * mssql offers no way to discard a connection: its pool destroys one that is `closed` or has
 * `hasError` set (the flag mssql itself sets on an 'error' event) the next time it is taken.
 */
export interface HandlerConnection {
  closed?: boolean;
  hasError?: boolean;
  /** tedious's view of the server's transaction state, kept from the server's ENVCHANGE tokens. */
  inTransaction?: boolean;
  close(): void;
}

/** The connection a begun mssql Transaction holds; null if this mssql keeps it elsewhere. */
export function connectionOf(transaction: sql.Transaction): HandlerConnection | null {
  const connection = (transaction as unknown as { _acquiredConnection?: unknown })._acquiredConnection;
  return connection !== null &&
    typeof connection === 'object' &&
    typeof (connection as HandlerConnection).close === 'function'
    ? (connection as HandlerConnection)
    : null;
}

/**
 * After a commit or rollback that failed: mssql has handed the connection back to the pool. If the
 * server still had the transaction open then (a request that timed out, an error tedious could not
 * pair with its transaction), the pool must not lend it out again, where the next caller's
 * statements would run in it: the pool destroys it instead when it is next taken.
 */
export function discardIfStillInTransaction(connection: HandlerConnection | null): void {
  if (connection && !connection.closed && connection.inTransaction !== false) connection.hasError = true;
}

function errorCode(error: unknown): unknown {
  return (error as { code?: unknown } | null)?.code;
}

/** How long rollback waits for an abandoned handler's request to end once its connection is closed. */
const REQUEST_END_WAIT_MS = 30_000;

/**
 * Rolls back a handler's transaction, whatever state the handler left it in; never rejects. While
 * the handler still has a request running (an abandoned handler), mssql refuses (EREQINPROG) and
 * would keep the connection, and the transaction open on it, for good: the connection is closed
 * instead (the server rolls back the transaction of a session that ends), which fails that
 * request, and the rollback is asked again until mssql lets go of the connection, which its pool
 * then destroys. A new request of the handler is refused meanwhile: mssql lends a transaction's
 * connection to one request at a time, and to none once the rollback went through.
 */
export async function rollbackOrClose(
  transaction: sql.Transaction,
  connection: HandlerConnection | null,
): Promise<void> {
  const startedAt = Date.now();
  for (;;) {
    try {
      await transaction.rollback();
      return;
    } catch (error) {
      if (errorCode(error) !== 'EREQINPROG') {
        // Already ended (the server rolled it back: a deadlock, XACT_ABORT) or failed: see above.
        discardIfStillInTransaction(connection);
        return;
      }
      if (!connection || Date.now() - startedAt > REQUEST_END_WAIT_MS) return;
      if (!connection.closed) connection.close();
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  }
}
