import sql from 'mssql';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { mssqlConfigFromUrl, SqlQueueConfigError } from '../../lib/src/index.js';
import { createQueueStore, type SqlQueueConnection } from '../../lib/src/store/create-store.js';

/** What mssqlConfigFromUrl throws for `url`; the message must never carry the password. */
function refusal(url: string, options?: { poolSize?: number }): string {
  try {
    mssqlConfigFromUrl(url, options);
  } catch (error) {
    expect(error).toBeInstanceOf(SqlQueueConfigError);
    expect((error as Error).message).not.toContain('s3cret');
    return (error as Error).message;
  }
  throw new Error(`accepted ${url}`);
}

describe('mssqlConfigFromUrl: the URL form README documents', () => {
  it('reads host, port, credentials, database and the README query, with the documented defaults', () => {
    expect(mssqlConfigFromUrl('mssql://queue_app:p%40ss@db.internal:1444/my%20app?encrypt=true')).toEqual({
      server: 'db.internal',
      port: 1444,
      user: 'queue_app',
      password: 'p@ss',
      database: 'my app',
      pool: { max: 10, min: 0, idleTimeoutMillis: 30_000 },
      options: { encrypt: true, trustServerCertificate: false, appName: 'nestjs-sql-queue' },
    });
    const local = mssqlConfigFromUrl(
      'sqlserver://sa:x@localhost/sqlqueue_test?encrypt=true&trustServerCertificate=true&appName=billing',
    );
    expect(local).toMatchObject({ server: 'localhost', port: 1433 });
    expect(local.options).toEqual({ encrypt: true, trustServerCertificate: true, appName: 'billing' });
  });

  it('sizes the pool from the option, unless the URL says poolSize', () => {
    expect(mssqlConfigFromUrl('mssql://u:p@h/db', { poolSize: 7 }).pool.max).toBe(7);
    expect(mssqlConfigFromUrl('mssql://u:p@h/db?poolSize=3', { poolSize: 7 }).pool.max).toBe(3);
    expect(refusal('mssql://u:s3cret@h/db?poolSize=many')).toMatch(/poolSize must be an integer from 1 to 1000/);
    expect(refusal('mssql://u:s3cret@h/db', { poolSize: 0 })).toMatch(/poolSize must be an integer/);
  });

  it('takes parameter names in any case and refuses unknown ones, suggesting the near name', () => {
    expect(mssqlConfigFromUrl('mssql://u:p@h/db?TrustServerCertificate=TRUE').options.trustServerCertificate).toBe(
      true,
    );
    expect(refusal('mssql://u:s3cret@h/db?trustServerCertifcate=true')).toMatch(
      /unknown parameter 'trustServerCertifcate' \(did you mean 'trustServerCertificate'\?\)/,
    );
  });

  it('reads encrypt as true, false or strict, and refuses anything else rather than turning encryption off', () => {
    expect(mssqlConfigFromUrl('mssql://u:p@h/db?encrypt=false').options.encrypt).toBe(false);
    expect(mssqlConfigFromUrl('mssql://u:p@h/db?encrypt=strict').options.encrypt).toBe('strict');
    expect(refusal('mssql://u:s3cret@h/db?encrypt=ture')).toMatch(/encrypt must be true, false or strict, got 'ture'/);
    expect(refusal('mssql://u:s3cret@h/db?trustServerCertificate=maybe')).toMatch(/must be true or false/);
  });

  it('names a named instance with instanceName or host%5CINSTANCE, without a port', () => {
    for (const url of [
      'mssql://u:p@db.internal/app?instanceName=SQLEXPRESS',
      'mssql://u:p@db.internal%5CSQLEXPRESS/app',
    ]) {
      const config = mssqlConfigFromUrl(url);
      expect(config).toMatchObject({ server: 'db.internal', options: { instanceName: 'SQLEXPRESS' } });
      expect(config.port).toBeUndefined();
    }
    expect(refusal('mssql://u:s3cret@db.internal\\SQLEXPRESS/app')).toMatch(/host%5CINSTANCE/);
    expect(refusal('mssql://u:s3cret@h:1433/app?instanceName=X')).toMatch(/both a port and an instance/);
    expect(refusal('mssql://u:s3cret@h%5CA/app?instanceName=B')).toMatch(/instance twice/);
  });

  it('connects to an IPv6 literal without its brackets, and takes a connect timeout in ms', () => {
    const config = mssqlConfigFromUrl('mssql://u:p@[::1]:1433/db?connectTimeout=2000');
    expect(config).toMatchObject({ server: '::1', port: 1433, connectionTimeout: 2_000 });
  });

  it('refuses what is not an SQL Server URL, never echoing the password', () => {
    expect(refusal('postgres://u:s3cret@h:5432/db')).toMatch(/scheme is not mssql: or sqlserver:/);
    expect(refusal('mssql://u:s3cret@h:1433/')).toMatch(/needs a host and a database/);
    // The JDBC form is not this URL form.
    expect(refusal('sqlserver://h:1433;databaseName=db;user=u;password=s3cret')).toMatch(/not a valid URL/);
    expect(refusal('')).toMatch(/connection\.url must be/);
    expect(refusal('mssql://u:s3cret%ZZ@h/db')).toMatch(/the password is not validly percent-encoded/);
  });
});

describe('mssqlConfigFromUrl: ADO connection strings', () => {
  it('parses them with mssql, sized by the option unless the string says Max Pool Size', () => {
    const ado =
      'Server=db.internal\\SQLEXPRESS;Database=app;User Id=queue_app;Password=p;Encrypt=true;TrustServerCertificate=true';
    const config = mssqlConfigFromUrl(ado, { poolSize: 4 });
    expect(config).toMatchObject({
      server: 'db.internal',
      database: 'app',
      user: 'queue_app',
      pool: { max: 4 },
      options: { instanceName: 'SQLEXPRESS', encrypt: true, trustServerCertificate: true },
    });
    expect(mssqlConfigFromUrl('Server=h,1444;Database=app;Max Pool Size=3', { poolSize: 4 })).toMatchObject({
      port: 1444,
      pool: { max: 3 },
    });
    expect(refusal('Database=app;Password=s3cret')).toMatch(/names no server/);
  });
});

describe('SQL Server session options the queue cannot work with are refused before connecting', () => {
  afterEach(() => {
    vi.restoreAllMocks();
  });

  const server = { server: '127.0.0.1', port: 1, user: 'u', password: 'p', database: 'db' };
  const useUtcFalse = /useUTC is false .*local time.*SYSUTCDATETIME\(\).*UTC offset/;
  const implicit = /enableImplicitTransactions is true .*uncommitted writes.*open transaction/;

  it.each<[string, () => SqlQueueConnection, RegExp]>([
    [
      'config useUTC: false',
      () => ({ dialect: 'mssql', config: { ...server, options: { useUTC: false } } }),
      /useUTC is false in connection\.config\.options/,
    ],
    [
      'config enableImplicitTransactions: true',
      () => ({ dialect: 'mssql', config: { ...server, options: { enableImplicitTransactions: true } } }),
      /enableImplicitTransactions is true in connection\.config\.options/,
    ],
    [
      'a shared pool built with useUTC: false',
      () => ({ pool: new sql.ConnectionPool({ ...server, options: { useUTC: false } }) }),
      /useUTC is false in the shared pool's config\.options/,
    ],
    [
      'a shared pool built with enableImplicitTransactions: true',
      () => ({ pool: new sql.ConnectionPool({ ...server, options: { enableImplicitTransactions: true } }) }),
      /enableImplicitTransactions is true in the shared pool's config\.options/,
    ],
    [
      'an ADO string with UseUTC=false',
      () => ({ dialect: 'mssql', url: 'Server=127.0.0.1,1;Database=db;User Id=u;Password=p;UseUTC=false' }),
      /useUTC is false in the options connection\.url sets/,
    ],
    [
      'an ADO string with Transaction Binding=Implicit Unbind',
      () => ({
        dialect: 'mssql',
        url: 'Server=127.0.0.1,1;Database=db;User Id=u;Password=p;Transaction Binding=Implicit Unbind',
      }),
      /enableImplicitTransactions is true in the options connection\.url sets/,
    ],
  ])('%s', async (_, connection, where) => {
    const connect = vi.spyOn(sql.ConnectionPool.prototype, 'connect');
    const created = createQueueStore(connection(), { schema: 'sqlqueue' });
    await expect(created).rejects.toBeInstanceOf(SqlQueueConfigError);
    await expect(created).rejects.toThrow(where);
    await expect(created).rejects.toThrow(where.source.includes('useUTC') ? useUtcFalse : implicit);
    expect(connect).not.toHaveBeenCalled();
  });

  it('accepts the defaults (useUTC true, no implicit transactions), set or left out', async () => {
    const connect = vi.spyOn(sql.ConnectionPool.prototype, 'connect');
    for (const options of [{}, { useUTC: true, enableImplicitTransactions: false }]) {
      const pool = new sql.ConnectionPool({ ...server, options });
      const shared = await createQueueStore({ pool }, { schema: 'sqlqueue' });
      const own = await createQueueStore({ dialect: 'mssql', config: { ...server, options } }, { schema: 'sqlqueue' });
      await shared.close();
      await own.close();
    }
    expect(connect).not.toHaveBeenCalled();
  });
});
