import pg from 'pg';
import type { PgDriver, PgQueryable, PgRows } from './postgres.driver.js';
import { quotePgIdentifier } from './postgres.identifiers.js';

/** The store's connection over a node-postgres pool (the only file of the store importing `pg`). */
export class NodePgDriver implements PgDriver {
  readonly kind = 'pg';

  constructor(
    private readonly pool: pg.Pool,
    private readonly ownsPool: boolean,
    private readonly onListenError: (error: Error) => void,
  ) {}

  /** node-postgres keeps the options a pool was built with (max defaults to 10). */
  get poolSize(): number {
    return (this.pool as unknown as { options?: { max?: number } }).options?.max ?? 10;
  }

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
