import sql from 'mssql';
import { afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { freePort } from '../helpers/private-postgres.js';
import { startSampleApp } from '../helpers/sample-app.js';

/**
 * The sample app configured for SQL Server as README documents it, against a local port nobody
 * listens on (there is no SQL Server here). Boot must get as far as the network and fail there,
 * with the pool sized by SQLQUEUE_POOL_SIZE: never on reading the URL.
 */
let port: number;

beforeAll(async () => {
  port = await freePort();
});

afterEach(() => {
  vi.restoreAllMocks();
});

/** Boots the sample app with `env`; returns the pool config it connected with and the boot error. */
async function failedBoot(env: Record<string, string>) {
  const connect = vi.spyOn(sql.ConnectionPool.prototype, 'connect');
  const error = await startSampleApp(env).then(
    async (app) => {
      await app.close();
      throw new Error('the sample app booted without a SQL Server');
    },
    (reason: unknown) => reason as { code?: string; message: string },
  );
  expect(connect).toHaveBeenCalledTimes(1);
  const pool = connect.mock.contexts[0] as unknown as { config: sql.config };
  return { error, config: pool.config };
}

describe('sample app on SQL Server from SQLQUEUE_URL', () => {
  it.each([
    ['mssql://', (p: number) => `mssql://sa:p%40ss@127.0.0.1:${p}/sample?encrypt=true&trustServerCertificate=true`],
    [
      'sqlserver://',
      (p: number) => `sqlserver://sa:p%40ss@127.0.0.1:${p}/sample?encrypt=true&trustServerCertificate=true`,
    ],
    [
      'an ADO string',
      (p: number) =>
        `Server=127.0.0.1,${p};Database=sample;User Id=sa;Password=p@ss;Encrypt=true;TrustServerCertificate=true`,
    ],
  ])('%s: boot fails on the network, with the pool SQLQUEUE_POOL_SIZE asks for', async (_, url) => {
    const started = Date.now();
    const { error, config } = await failedBoot({ SQLQUEUE_URL: url(port), SQLQUEUE_POOL_SIZE: '7' });

    expect(error.message).not.toMatch(/config\.server/);
    expect(error.code).toBe('ESOCKET');
    expect(error.message).toMatch(/ECONNREFUSED|Could not connect|Failed to connect/);
    expect(Date.now() - started).toBeLessThan(10_000);
    expect(config).toMatchObject({
      server: '127.0.0.1',
      port,
      database: 'sample',
      user: 'sa',
      password: 'p@ss',
      pool: { max: 7 },
      options: { encrypt: true, trustServerCertificate: true },
    });
  });
});
