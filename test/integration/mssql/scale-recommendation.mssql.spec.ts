/**
 * The scale recommendation on SQL Server (issue 26): the contract (scale-contract.ts) on
 * `EXEC [<schema>].[DesiredReaders] @Queue = …`, what KEDA's mssql scaler runs, under both
 * databases: the same number as core/scaling on the store's inputs, and a login with only the
 * printed grant (EXECUTE on the procedure, which runs AS OWNER) can read it and nothing else.
 */
import sql from 'mssql';
import { createMssqlStore } from '../../../lib/src/store/mssql/mssql.connect.js';
import { mssqlScalerGrantsScript } from '../../../lib/src/store/mssql/mssql.migrations.js';
import { dropMssqlSchema, openMssqlPool } from '../../helpers/mssql.js';
import { describeScaleContract } from '../scale-contract.js';
import { describeEachMssqlDatabase } from './mssql-databases.js';

async function withPool<T>(url: string, work: (pool: sql.ConnectionPool) => Promise<T>): Promise<T> {
  const pool = await openMssqlPool(url, 1);
  try {
    return await work(pool);
  } finally {
    await pool.close();
  }
}

const readOn = async (request: sql.Request, schema: string, queue: string) =>
  Number(
    (
      await request
        .input('Queue', sql.NVarChar(128), queue)
        .execute<{ DesiredReaders: number }>(`[${schema}].[DesiredReaders]`)
    ).recordset[0]!.DesiredReaders,
  );

describeEachMssqlDatabase('scale recommendation', (db) => {
  describeScaleContract({
    name: `mssql ${db.label}`,
    openStore: async (schema) => createMssqlStore({ url: db.url, poolSize: 4 }, { schema }),
    desiredReaders: (schema, queue) => withPool(db.url, (pool) => readOn(pool.request(), schema, queue)),
    addCompletions: (schema, queue, minutesAgo, completed, busyMs) =>
      withPool(db.url, async (pool) => {
        await pool
          .request()
          .input('queue', sql.NVarChar(128), queue)
          .input('minutesAgo', sql.Int, minutesAgo)
          .input('completed', sql.BigInt, completed)
          .input('busyMs', sql.BigInt, busyMs)
          .query(`DECLARE @anchor datetime2(3) = DATETIME2FROMPARTS(2000, 1, 1, 0, 0, 0, 0, 3);
INSERT INTO [${schema}].[Throughput] ([Minute], [Queue], [Completed], [Failed], [Dead], [BusyMs])
VALUES (DATEADD(minute, DATEDIFF(minute, @anchor, SYSUTCDATETIME()) - @minutesAgo, @anchor), @queue, @completed, 0, 0, @busyMs);`);
      }),
    asGrantedScaler: (schema, principal, work) =>
      withPool(db.url, async (pool) => {
        await pool.request().batch(`CREATE USER [${principal}] WITHOUT LOGIN;`);
        for (const batch of mssqlScalerGrantsScript(schema, principal).split(/^GO$/m)) {
          if (batch.trim()) await pool.request().batch(batch);
        }
        await pool.request().batch(`EXECUTE AS USER = N'${principal}';`);
        try {
          return await work({
            desiredReaders: (queue) => readOn(pool.request(), schema, queue),
            readJobs: () => pool.request().query(`SELECT COUNT(*) AS [N] FROM [${schema}].[Jobs];`),
          });
        } finally {
          await pool.request().batch('REVERT;');
        }
      }),
    dropSchema: (schema) => dropMssqlSchema(db.url, schema),
    dropPrincipal: (principal) =>
      withPool(db.url, async (pool) => {
        await pool.request().batch(`IF USER_ID(N'${principal}') IS NOT NULL DROP USER [${principal}];`);
      }),
  });
});
