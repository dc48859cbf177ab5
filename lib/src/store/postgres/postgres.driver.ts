import type { PGlite } from '@electric-sql/pglite';
import pg from 'pg';
import { SqlQueueValidationError } from '../../core/errors.js';
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
  /** Runs a hot statement as a named prepared statement where the driver supports it. */
  queryPrepared<R = Record<string, unknown>>(name: string, text: string, params: unknown[]): Promise<PgRows<R>>;
  transaction<T>(work: (client: PgQueryable) => Promise<T>): Promise<T>;
  listen(channel: string, onMessage: (payload: string) => void): Promise<() => Promise<void>>;
  close(): Promise<void>;
}

export class NodePgDriver implements PgDriver {
  readonly kind = 'pg';

  constructor(
    private readonly pool: pg.Pool,
    private readonly ownsPool: boolean,
    private readonly onListenError: (error: Error) => void,
  ) {}

  async query<R>(text: string, params: unknown[] = []): Promise<PgRows<R>> {
    return (await this.pool.query(text, params)) as unknown as PgRows<R>;
  }

  async queryPrepared<R>(name: string, text: string, params: unknown[]): Promise<PgRows<R>> {
    return (await this.pool.query({ name, text, values: params })) as unknown as PgRows<R>;
  }

  async transaction<T>(work: (client: PgQueryable) => Promise<T>): Promise<T> {
    const client = await this.pool.connect();
    // A checked-out client has no pool listener: if its connection drops, node-postgres emits
    // 'error' on it (besides failing the query), and an unheard 'error' ends the process.
    let broken: Error | undefined;
    const onError = (error: Error) => {
      broken = error;
    };
    client.on('error', onError);
    try {
      await client.query('BEGIN');
      const result = await work(client as unknown as PgQueryable);
      await client.query('COMMIT');
      return result;
    } catch (error) {
      if (!broken) await client.query('ROLLBACK').catch(() => undefined);
      throw error;
    } finally {
      client.removeListener('error', onError);
      // Passing the error makes the pool discard the connection instead of reusing it.
      client.release(broken);
    }
  }

  /**
   * LISTEN needs one session for as long as it listens, so it gets a client of its own that
   * reconnects with backoff; the pool's connections stay free for statements.
   */
  async listen(channel: string, onMessage: (payload: string) => void): Promise<() => Promise<void>> {
    const options = this.pool.options as pg.ClientConfig;
    let client: pg.Client | null = null;
    let stopped = false;
    let retryMs = 250;
    let timer: NodeJS.Timeout | null = null;

    const connect = async (): Promise<void> => {
      if (stopped) return;
      const next = new pg.Client({ ...options, application_name: 'nestjs-sql-queue listener' });
      next.on('notification', (message) => {
        if (message.channel === channel && message.payload) onMessage(message.payload);
      });
      next.on('error', (error) => {
        this.onListenError(error);
        scheduleReconnect(next);
      });
      try {
        await next.connect();
        await next.query(`LISTEN ${quotePgIdentifier(channel)}`);
        if (stopped) {
          await next.end().catch(() => undefined);
          return;
        }
        client = next;
        retryMs = 250;
      } catch (error) {
        this.onListenError(error as Error);
        scheduleReconnect(next);
      }
    };
    const scheduleReconnect = (failed: pg.Client): void => {
      void failed.end().catch(() => undefined);
      if (client === failed) client = null;
      if (stopped || timer) return;
      timer = setTimeout(() => {
        timer = null;
        void connect();
      }, retryMs);
      timer.unref();
      retryMs = Math.min(retryMs * 2, 10_000);
    };

    await connect();
    return async () => {
      stopped = true;
      if (timer) clearTimeout(timer);
      const current = client;
      client = null;
      if (current) await current.end().catch(() => undefined);
    };
  }

  async close(): Promise<void> {
    if (this.ownsPool) await this.pool.end();
  }
}

/** Embedded PostgreSQL (WASM): one session, so statements are serialized by PGlite itself. */
export class PGliteDriver implements PgDriver {
  readonly kind = 'pglite';

  constructor(
    private readonly db: PGlite,
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
    const unsubscribe = await this.db.listen(channel, onMessage);
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
  return candidate as PgQueryable;
}
