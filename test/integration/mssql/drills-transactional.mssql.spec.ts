/**
 * The exactly-once drill of transactional handlers (drills/transactional.drills.ts) on both SQL
 * Server databases: the handler's writes, its follow-up job and its completion commit in one
 * mssql Transaction, or not at all, whatever moment a SIGKILL picks.
 */
import { createMssqlStore } from '../../../lib/src/store/mssql/mssql.connect.js';
import { dropMssqlSchema, mssqlRows } from '../../helpers/mssql.js';
import { transactionalDrills, type ExactlyOnceReport } from '../drills/transactional.drills.js';
import { describeEachMssqlDatabase } from './mssql-databases.js';

describeEachMssqlDatabase('exactly-once drill: transactional handlers', (db) =>
  transactionalDrills({
    dialect: 'mssql',
    url: db.url,
    openStore: (schema) => createMssqlStore({ url: db.url, poolSize: 4 }, { schema }),
    async createEffectTable(schema) {
      await mssqlRows(
        db.url,
        `CREATE TABLE [${schema}].[TxEffects] ([JobId] bigint NOT NULL, [Queue] nvarchar(128) NOT NULL, [Pid] int NOT NULL,
           [At] datetime2(3) NOT NULL DEFAULT SYSUTCDATETIME());`,
      );
    },
    dropSchema: (schema) => dropMssqlSchema(db.url, schema),
    async doneCount(schema) {
      const [row] = await mssqlRows<{ n: number }>(
        db.url,
        `SELECT COUNT(*) AS n FROM [${schema}].[Jobs] WHERE [Queue] IN (N'tx', N'tx-next') AND [State] = 'done'`,
      );
      return row!.n;
    },
    async report(schema) {
      const [row] = await mssqlRows<ExactlyOnceReport>(
        db.url,
        `WITH e AS (SELECT [JobId], COUNT(*) AS n FROM [${schema}].[TxEffects] GROUP BY [JobId]),
              j AS (SELECT * FROM [${schema}].[Jobs] WHERE [Queue] IN (N'tx', N'tx-next')),
              c AS (SELECT CAST(JSON_VALUE([Payload], '$.parent') AS bigint) AS parent, COUNT(*) AS n
                    FROM j WHERE [Queue] = N'tx-next' GROUP BY CAST(JSON_VALUE([Payload], '$.parent') AS bigint))
         SELECT (SELECT COUNT(*) FROM j) AS jobs,
                (SELECT COUNT(*) FROM j WHERE [State] <> 'done') AS not_done,
                (SELECT COUNT(*) FROM j LEFT JOIN e ON e.[JobId] = j.[Id] WHERE e.[JobId] IS NULL) AS without_effect,
                (SELECT COUNT(*) FROM e WHERE n > 1) AS with_two,
                (SELECT COUNT(*) FROM e LEFT JOIN j ON j.[Id] = e.[JobId] WHERE j.[Id] IS NULL OR j.[State] <> 'done') AS stray,
                (SELECT COUNT(*) FROM j LEFT JOIN c ON c.parent = j.[Id] WHERE j.[Queue] = N'tx' AND c.parent IS NULL) AS first_without_child,
                (SELECT COUNT(*) FROM c WHERE n > 1) AS first_with_two,
                (SELECT COUNT(*) FROM j WHERE [Attempts] > 1) AS reruns;`,
      );
      return row!;
    },
  }),
);
