import type sql from 'mssql';
import { describe, expect, it } from 'vitest';
import {
  MssqlBrokerDriver,
  MssqlBrokerSession,
  readerPoolConfig,
} from '../../lib/src/broker/driver/broker.mssql-driver.js';
import { readBrokerQueueHealth } from '../../lib/src/broker/activation/broker.listener.queries.js';
import { mssqlConfigFromUrl } from '../../lib/src/store/mssql/mssql.config.js';
import { SqlQueueTransactionError } from '../../lib/src/core/errors.js';
import {
  MSSQL_AUTOCOMMIT_SESSION,
  MSSQL_NESTED_OWN_TRANSACTION,
  MSSQL_OWN_TRANSACTION_GUARD,
  MSSQL_STORE_SESSION,
} from '../../lib/src/store/mssql/mssql.queries.js';

describe('the Service Broker reader pool config', () => {
  const base = {
    ...mssqlConfigFromUrl('mssql://app:secret@db.example:1433/shop?encrypt=true&poolSize=20'),
    requestTimeout: 15_000,
    options: { encrypt: true, requestTimeout: 15_000, abortTransactionOnError: true, appName: 'shop' },
  } as sql.config;
  const config = readerPoolConfig(base, { readerConnections: 7, requestTimeoutMs: 20_000 });

  it('keeps the server, login and TLS settings of the store pool', () => {
    expect(config.server).toBe('db.example');
    expect(config.user).toBe('app');
    expect(config.database).toBe('shop');
    expect(config.options?.encrypt).toBe(true);
    expect(config.options?.appName).toBe('shop');
  });

  it('sets the request timeout where tedious reads it first (options.requestTimeout) and on the config', () => {
    // node-mssql takes options.requestTimeout before config.requestTimeout: both must carry it,
    // or a pool config with its own options.requestTimeout would cancel every idle WAITFOR.
    expect(config.options?.requestTimeout).toBe(20_000);
    expect(config.requestTimeout).toBe(20_000);
  });

  it('turns XACT_ABORT off: a handler error must roll back to its savepoint, not doom the transaction', () => {
    expect(config.options?.abortTransactionOnError).toBe(false);
  });

  it('sizes its own pool to the readers, never the store pool', () => {
    expect(config.pool?.max).toBe(7);
    expect(config.pool?.min).toBe(0);
    expect(base.pool?.max).toBe(20);
  });
});

describe('the Service Broker driver on the shared pool (review 2, R2-6)', () => {
  /** A stand-in for the store's pool: records what each request sends and binds. */
  function sharedPool() {
    const sent: { text: string; inputs: string[] }[] = [];
    const pool = {
      request() {
        const inputs: string[] = [];
        const request = {
          input(name: string) {
            inputs.push(name);
            return request;
          },
          async query(text: string) {
            sent.push({ text, inputs });
            return { recordsets: [[{ one: 1 }]], recordset: [{ one: 1 }] };
          },
        };
        return request;
      },
    };
    return { pool: pool as unknown as sql.ConnectionPool, sent };
  }

  it("runs every autocommit batch behind the store's guard: an open transaction is refused, leftover session options reset", async () => {
    const { pool, sent } = sharedPool();
    const driver = new MssqlBrokerDriver(pool, {} as sql.ConnectionPool, {} as sql.config);
    const rows = await driver.query(readBrokerQueueHealth(), { queue: { type: 'nvarchar', value: '[s].[q]' } });
    expect(rows).toEqual([{ one: 1 }]);
    expect(sent).toEqual([{ text: `${MSSQL_AUTOCOMMIT_SESSION}${readBrokerQueueHealth()}`, inputs: ['queue'] }]);
    // The guard comes first, before any option is set (the store's own prefix, minus isolation and deadlock priority).
    expect(MSSQL_AUTOCOMMIT_SESSION).toMatch(/^IF @@TRANCOUNT <> 0\n {2}THROW 51001, /);
    expect(MSSQL_AUTOCOMMIT_SESSION).toContain('SET NOCOUNT ON;\nSET IMPLICIT_TRANSACTIONS OFF;\nSET ROWCOUNT 0;\n');
    expect(MSSQL_STORE_SESSION.startsWith(MSSQL_AUTOCOMMIT_SESSION)).toBe(true);
  });
});

describe('a transaction the Service Broker driver begins refuses to nest in one the connection had', () => {
  /** Requests that record their text and answer with `answer` (an Error is thrown). */
  function session(owned: boolean, answer: (text: string) => unknown = () => [{ one: 1 }]) {
    const sent: string[] = [];
    const requests = () => {
      const request = {
        input: () => request,
        async query(text: string) {
          sent.push(text);
          const rows = answer(text);
          if (rows instanceof Error) throw rows;
          return { recordsets: [rows], recordset: rows };
        },
      };
      return request as unknown as sql.Request;
    };
    const transaction = {
      commit: async () => sent.push('commit'),
      rollback: async () => sent.push('rollback'),
    } as unknown as sql.Transaction;
    return { session: new MssqlBrokerSession(transaction, owned, requests), sent };
  }

  it('puts the guard before its first statement only: no round trip, no table read', async () => {
    const { session: own, sent } = session(true);
    await own.query('SELECT 1 AS [one];');
    await own.query('SELECT 2 AS [two];');
    await own.commit();
    expect(sent).toEqual([`${MSSQL_OWN_TRANSACTION_GUARD}SELECT 1 AS [one];`, 'SELECT 2 AS [two];', 'commit']);
    expect(MSSQL_OWN_TRANSACTION_GUARD).toMatch(/^IF @@TRANCOUNT > 1\n {2}THROW 51005, N'[^']+', 1;\n$/);
  });

  it("leaves the application's transaction alone: no guard (it may nest on purpose), no commit, no rollback", async () => {
    const { session: callers, sent } = session(false);
    await callers.query('SELECT 1 AS [one];');
    await callers.commit();
    await callers.rollback();
    expect(sent).toEqual(['SELECT 1 AS [one];']);
  });

  it('reports the refusal as SqlQueueTransactionError naming the shared pool', async () => {
    const refusal = Object.assign(new Error('nested'), { number: MSSQL_NESTED_OWN_TRANSACTION });
    const { session: own } = session(true, () => refusal);
    const error = await own.query('SELECT 1 AS [one];').catch((e: unknown) => e);
    expect(error).toBeInstanceOf(SqlQueueTransactionError);
    expect((error as Error).message).toMatch(/nested in one its pooled connection already had .*shared pool/);
    expect((error as Error).cause).toBe(refusal);
  });
});
