import { SqlQueueTransactionError, SqlQueueValidationError } from '../../core/errors.js';
import type { SqlQueuePGlite } from '../driver-shapes.js';
import { quotePgIdentifier } from './postgres.identifiers.js';

export interface PgRows<R> {
  rows: R[];
}

/** What a statement needs: node-postgres clients and pools and PGlite all fit. */
export interface PgQueryable {
  query<R = Record<string, unknown>>(text: string, params?: unknown[]): Promise<PgRows<R>>;
}

/**
 * The connection the store owns: autocommit statements, a transaction for migrations, and a
 * channel for wake-ups between processes. One implementation for a pg.Pool, one for PGlite.
 */
export interface PgDriver extends PgQueryable {
  readonly kind: 'pg' | 'pglite';
  /** Connections of the pool; null for PGlite's one session. */
  readonly poolSize: number | null;
  /** Runs a hot statement as a named prepared statement where the driver supports it. */
  queryPrepared<R = Record<string, unknown>>(name: string, text: string, params: unknown[]): Promise<PgRows<R>>;
  transaction<T>(work: (client: PgQueryable) => Promise<T>): Promise<T>;
  listen(channel: string, onMessage: (payload: string) => void): Promise<() => Promise<void>>;
  close(): Promise<void>;
}

/** Embedded PostgreSQL (WASM): one session, so statements are serialized by PGlite itself. */
export class PGliteDriver implements PgDriver {
  readonly kind = 'pglite';
  readonly poolSize = null;

  constructor(
    private readonly db: SqlQueuePGlite,
    private readonly ownsDb: boolean,
  ) {}

  async query<R>(text: string, params: unknown[] = []): Promise<PgRows<R>> {
    return (await this.db.query(text, params)) as PgRows<R>;
  }

  queryPrepared<R>(_name: string, text: string, params: unknown[]): Promise<PgRows<R>> {
    return this.query<R>(text, params);
  }

  transaction<T>(work: (client: PgQueryable) => Promise<T>): Promise<T> {
    return this.db.transaction((tx) => work(tx as unknown as PgQueryable));
  }

  async listen(channel: string, onMessage: (payload: string) => void): Promise<() => Promise<void>> {
    // PGlite sends LISTEN with the name as given, unquoted, so PostgreSQL would fold it to lower
    // case while pg_notify keeps the case: quoting keeps them the same channel.
    const unsubscribe = await this.db.listen(quotePgIdentifier(channel), onMessage);
    return () => unsubscribe();
  }

  async close(): Promise<void> {
    if (this.ownsDb) await this.db.close();
  }
}

/**
 * Accepts the caller's transaction for an enqueue: a pg client on which BEGIN was issued, or a
 * PGlite transaction. A pool is refused, because each of its queries may run on another
 * connection and would silently commit on its own.
 */
export function asCallerTransaction(transaction: unknown): PgQueryable {
  const candidate = transaction as Partial<PgQueryable> & { totalCount?: unknown; idleCount?: unknown };
  if (!candidate || typeof candidate.query !== 'function') {
    throw new SqlQueueValidationError(
      'transaction must be the pg client on which you called BEGIN (pool.connect()), or a PGlite transaction',
    );
  }
  if (typeof candidate.totalCount === 'number' && typeof candidate.idleCount === 'number') {
    throw new SqlQueueValidationError(
      'transaction is a pg.Pool: pass the client you called BEGIN on (const client = await pool.connect()), not the pool',
    );
  }
  // node-postgres reports the server's last transaction status ('I' idle, 'T' in a transaction,
  // 'E' failed): a client outside any transaction is refused, since the job would commit at
  // once and outlive the caller's ROLLBACK.
  const client = transaction as { getTransactionStatus?: () => unknown };
  if (typeof client.getTransactionStatus === 'function' && client.getTransactionStatus() === 'I') {
    throw new SqlQueueValidationError(
      'transaction is a pg client with no open transaction: call BEGIN on it first, or enqueue without `transaction`',
    );
  }
  return candidate as PgQueryable;
}

/**
 * A transactional handler's view of its pg client: once the transaction has ended its statements
 * are refused, since the client is back in the pool by then, perhaps in another caller's
 * transaction (an abandoned handler may go on using it). It cannot release or end the client,
 * which is the queue's until the transaction ends. Everything else is the client's own.
 */
export function endingClient<C extends object>(client: C, ended: () => boolean): C {
  const refusal = () =>
    new SqlQueueTransactionError(
      "this job's transaction has ended (the handler returned, threw, or was abandoned): its connection is back in the pool",
    );
  return new Proxy(client, {
    get(target, property) {
      if (property === 'query') {
        return (...args: unknown[]) => {
          if (!ended()) return (target as unknown as { query(...a: unknown[]): unknown }).query(...args);
          const callback = args.at(-1);
          if (typeof callback !== 'function') return Promise.reject(refusal());
          process.nextTick(callback as (error: Error) => void, refusal());
          return undefined;
        };
      }
      if (property === 'release' || property === 'end') {
        return () => {
          throw new SqlQueueTransactionError(
            `context.transaction.${property}(): the job's transaction belongs to the queue, which commits or rolls it back and releases its connection when the handler returns`,
          );
        };
      }
      const value: unknown = Reflect.get(target, property, target);
      return typeof value === 'function' ? (value as (...a: unknown[]) => unknown).bind(target) : value;
    },
  });
}
