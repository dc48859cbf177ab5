import { describe, expect, it } from 'vitest';
import { dialectOf, loadConfig } from '../../sample-app/src/app.config.js';
import { sampleMssqlConfig } from '../../sample-app/src/database/sample.database.js';
import { mssqlStatements } from '../../sample-app/src/database/sample.sql.js';
import { checkTsqlWithKnownGaps } from '../helpers/tsql-grammar.js';

describe('sample app configuration from the environment', () => {
  it('runs on an embedded PGlite in sample-app/.data when nothing is set', () => {
    const config = loadConfig({});
    expect(config).toMatchObject({ port: 3000, databaseUrl: null, dialect: 'postgres', queueSchema: 'sqlqueue' });
    expect(config.dataDir).toMatch(/sample-app\/\.data\/pglite$/);
  });

  it('recognises PostgreSQL and SQL Server URLs and ADO strings', () => {
    expect(dialectOf('postgres://u@h:5432/db')).toBe('postgres');
    expect(dialectOf('postgresql://u@h/db')).toBe('postgres');
    expect(dialectOf('mssql://sa:p@h:1433/db?encrypt=true')).toBe('mssql');
    expect(dialectOf('sqlserver://h/db')).toBe('mssql');
    expect(dialectOf('Server=h,1433;Database=db;User Id=u;Password=p')).toBe('mssql');
    expect(() => dialectOf('mysql://h/db')).toThrow(/SQLQUEUE_URL/);
  });

  it('opens SQL Server from SQLQUEUE_URL as the queue parses it, sized by SQLQUEUE_POOL_SIZE', () => {
    const url = 'mssql://sa:p%40ss@db:1433/app?encrypt=true&trustServerCertificate=true';
    const config = loadConfig({ SQLQUEUE_URL: url, SQLQUEUE_POOL_SIZE: '7' });
    expect(sampleMssqlConfig(config.databaseUrl!, config.poolSize)).toMatchObject({
      server: 'db',
      port: 1433,
      database: 'app',
      password: 'p@ss',
      pool: { max: 7 },
      connectionTimeout: 5_000,
      options: { encrypt: true, trustServerCertificate: true },
    });
    expect(sampleMssqlConfig(`${url}&connectTimeout=900`, 7).connectionTimeout).toBe(900);
    expect(sampleMssqlConfig('Server=db,1433;Database=app;User Id=sa;Password=p', 7).pool.max).toBe(7);
  });

  it('reads the dashboard password from DASHBOARD_PASSWORD (none when unset or empty)', () => {
    expect(loadConfig({}).dashboardPassword).toBeNull();
    expect(loadConfig({ DASHBOARD_PASSWORD: '' }).dashboardPassword).toBeNull();
    expect(loadConfig({ DASHBOARD_PASSWORD: 's3cret' }).dashboardPassword).toBe('s3cret');
  });

  it('refuses bad numbers and schema names, naming the variable', () => {
    expect(() => loadConfig({ PORT: 'http' })).toThrow(/PORT/);
    expect(() => loadConfig({ SAMPLE_APP_SCHEMA: 'x; drop' })).toThrow(/SAMPLE_APP_SCHEMA/);
  });
});

describe("the sample app's T-SQL parses", () => {
  const statements = mssqlStatements('sample_app');
  const batches: [string, string][] = [
    ['setupLock', statements.setupLock],
    ...statements.setup.map((text, i): [string, string] => [`setup ${i}`, text]),
    ['insertSignup', statements.insertSignup],
    ['recordSent', statements.recordSent],
    ['listSent', statements.listSent],
  ];
  it.each(batches)('%s', (_, text) => {
    expect(checkTsqlWithKnownGaps(text).errors).toEqual([]);
  });
});
