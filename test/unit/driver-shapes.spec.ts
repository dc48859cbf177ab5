import type { PGlite, Transaction as PGliteTransaction } from '@electric-sql/pglite';
import type sql from 'mssql';
import type pg from 'pg';
import { describe, expectTypeOf, it } from 'vitest';
import type {
  EnqueueCallOptions,
  QueueProducer,
  SqlQueueConnection,
  SqlQueueModuleOptions,
  SqlQueueMssqlConfig,
  SqlQueueMssqlPool,
  SqlQueuePgPool,
  SqlQueuePGlite,
} from '../../lib/src/index.js';

// Type tests: `npm run typecheck` checks them (expectTypeOf does nothing at run time). The public
// types describe drivers structurally so that they need no optional peer installed; these prove
// the drivers' real objects still fit, and that the shapes still refuse the wrong object.

type Transaction = NonNullable<EnqueueCallOptions['transaction']>;

describe("the drivers' own objects fit the public connection types", () => {
  it('node-postgres: a pg.Pool is a pool, a pg.PoolClient is a transaction', () => {
    expectTypeOf<pg.Pool>().toExtend<SqlQueuePgPool>();
    expectTypeOf<{ pool: pg.Pool }>().toExtend<SqlQueueConnection>();
    expectTypeOf<{ dialect: 'postgres'; pool: pg.Pool }>().toExtend<SqlQueueConnection>();
    expectTypeOf<pg.PoolClient>().toExtend<Transaction>();
    expectTypeOf<pg.PoolClient>().not.toExtend<SqlQueuePgPool>();
  });

  it('PGlite: an instance is a connection, one of its transactions is a transaction', () => {
    expectTypeOf<PGlite>().toExtend<SqlQueuePGlite>();
    expectTypeOf<{ dialect: 'postgres'; pglite: PGlite }>().toExtend<SqlQueueConnection>();
    expectTypeOf<PGliteTransaction>().toExtend<Transaction>();
  });

  it('mssql: a ConnectionPool is a pool, its config a config, a Transaction a transaction', () => {
    expectTypeOf<sql.ConnectionPool>().toExtend<SqlQueueMssqlPool>();
    expectTypeOf<{ pool: sql.ConnectionPool }>().toExtend<SqlQueueConnection>();
    expectTypeOf<sql.config>().toExtend<SqlQueueMssqlConfig>();
    expectTypeOf<{ dialect: 'mssql'; config: sql.config }>().toExtend<SqlQueueConnection>();
    expectTypeOf<sql.Transaction>().toExtend<Transaction>();
    expectTypeOf<sql.Transaction>().not.toExtend<SqlQueueMssqlPool>();
  });

  it('the module options and the producer take them', () => {
    expectTypeOf<SqlQueueModuleOptions['connection']>().toEqualTypeOf<SqlQueueConnection>();
    expectTypeOf<QueueProducer['enqueue']>().parameter(2).toExtend<{ transaction?: unknown } | undefined>();
  });

  it('an mssql config literal is still checked, and still takes any driver option', () => {
    const literal: SqlQueueConnection = {
      dialect: 'mssql',
      config: {
        server: 'db',
        authentication: { type: 'ntlm', options: { userName: 'u', password: 'p', domain: 'd' } },
        options: { encrypt: 'strict', enableArithAbort: true },
        pool: { max: 4, evictionRunIntervalMillis: 1_000 },
      },
    };
    expectTypeOf(literal).toExtend<SqlQueueConnection>();
    // @ts-expect-error a misspelt field is refused, as with mssql's own type
    const misspelt: SqlQueueConnection = { dialect: 'mssql', config: { server: 'db', pasword: 'x' } };
    // @ts-expect-error the server is required
    const serverless: SqlQueueConnection = { dialect: 'mssql', config: { user: 'sa' } };
    expectTypeOf(misspelt).not.toBeAny();
    expectTypeOf(serverless).not.toBeAny();
  });

  it('anything else is refused', () => {
    expectTypeOf<{ pool: string }>().not.toExtend<SqlQueueConnection>();
    expectTypeOf<{ dialect: 'postgres'; pglite: { query: () => void } }>().not.toExtend<SqlQueueConnection>();
    expectTypeOf<SqlQueueConnection>().not.toBeAny();
  });
});
