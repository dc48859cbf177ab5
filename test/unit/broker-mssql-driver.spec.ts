import type sql from 'mssql';
import { describe, expect, it } from 'vitest';
import { readerPoolConfig } from '../../lib/src/broker/broker.mssql-driver.js';
import { mssqlConfigFromUrl } from '../../lib/src/store/mssql/mssql.config.js';

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
