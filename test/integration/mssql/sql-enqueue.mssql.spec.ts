/**
 * Enqueue from T-SQL on SQL Server (issue 25): the contract (sql-enqueue-contract.ts) on
 * [<schema>].[Enqueue], under both databases, and what the procedure assumes of the server beyond
 * the producer's checks: NCHAR(0) found by CHARINDEX under a binary collation, surrogates built from
 * bytes, ISJSON refusing scalars, a trigger calling it inside the statement's transaction, and
 * EXECUTE AS OWNER sparing the caller every right on the sequence and sp_getapplock.
 */
import sql from 'mssql';
import { expect, it } from 'vitest';
import { createMssqlStore } from '../../../lib/src/store/mssql/mssql.connect.js';
import { mssqlEnqueueGrantsScript } from '../../../lib/src/store/mssql/mssql.migrations.js';
import { MSSQL_ENQUEUE_REFUSED } from '../../../lib/src/store/mssql/queries/enqueue-procedure.queries.js';
import { uniqueSchema } from '../../helpers/databases.js';
import { dropMssqlSchema, mssqlErrorNumber, openMssqlPool } from '../../helpers/mssql.js';
import { describeSqlEnqueueContract, type SqlEnqueueSession } from '../sql-enqueue-contract.js';
import type { SqlEnqueueCall } from '../sql-enqueue-cases.js';
import { describeEachMssqlDatabase, type MssqlDatabase } from './mssql-databases.js';

/** Binds one SqlEnqueueCall as the procedure's parameters; what it leaves out takes its default. */
function bindEnqueueCall(request: sql.Request, call: SqlEnqueueCall): sql.Request {
  const o = call.options ?? {};
  request.input('Queue', sql.NVarChar(4000), call.queue);
  // A null payload is SQL NULL, as a trigger without one passes it.
  request.input(
    'Payload',
    sql.NVarChar(sql.MAX),
    call.payloadText ?? (call.payload === null ? null : JSON.stringify(call.payload)),
  );
  if (o.idempotencyKey !== undefined) request.input('IdempotencyKey', sql.NVarChar(4000), o.idempotencyKey);
  if (o.groupKey !== undefined) request.input('GroupKey', sql.NVarChar(4000), o.groupKey);
  if (o.delayMs !== undefined) request.input('DelayMs', sql.BigInt, o.delayMs);
  if (o.priority !== undefined) request.input('Priority', sql.Int, o.priority);
  if (o.maxAttempts !== undefined) request.input('MaxAttempts', sql.Int, o.maxAttempts);
  if (o.runAt !== undefined) request.input('RunAt', sql.DateTimeOffset(3), o.runAt);
  if (o.concurrencyKey !== undefined) request.input('ConcurrencyKey', sql.NVarChar(4000), o.concurrencyKey);
  request.output('JobId', sql.BigInt);
  request.output('Created', sql.Bit);
  return request;
}

async function mssqlSession(db: MssqlDatabase, schema: string): Promise<SqlEnqueueSession> {
  // One connection: the principal's context and the transaction stay on it.
  const pool = await openMssqlPool(db.url, 1);
  const s = `[${schema}]`;
  let transaction: sql.Transaction | null = null;
  const request = () => (transaction ? new sql.Request(transaction) : new sql.Request(pool));
  const end = async (how: 'commit' | 'rollback') => {
    const open = transaction;
    transaction = null;
    await (how === 'commit' ? open!.commit() : open!.rollback());
  };
  const session: SqlEnqueueSession = {
    async enqueue(call) {
      const result = await bindEnqueueCall(request(), call).execute(`${s}.[Enqueue]`);
      return { jobId: String(result.output.JobId), created: Boolean(result.output.Created) };
    },
    async begin() {
      transaction = new sql.Transaction(pool);
      await transaction.begin(sql.ISOLATION_LEVEL.READ_COMMITTED);
    },
    commit: () => end('commit'),
    rollback: () => end('rollback'),
    async createOrderTrigger(queue) {
      await request().batch(
        `CREATE TABLE ${s}.[Orders] ([Id] bigint NOT NULL PRIMARY KEY, [Total] decimal(18, 2) NOT NULL);`,
      );
      await request().batch(`CREATE TRIGGER ${s}.[OrderPlaced] ON ${s}.[Orders] AFTER INSERT AS
BEGIN
  SET NOCOUNT ON;
  DECLARE @id bigint, @total decimal(18, 2), @payload nvarchar(max), @key nvarchar(255);
  DECLARE placed CURSOR LOCAL FAST_FORWARD FOR SELECT [Id], [Total] FROM inserted;
  OPEN placed;
  FETCH NEXT FROM placed INTO @id, @total;
  WHILE @@FETCH_STATUS = 0
  BEGIN
    SET @payload = (SELECT @id AS orderId, @total AS total FOR JSON PATH, WITHOUT_ARRAY_WRAPPER);
    SET @key = CONCAT(N'order:', @id);
    EXEC ${s}.[Enqueue] @Queue = N'${queue}', @Payload = @payload, @IdempotencyKey = @key;
    FETCH NEXT FROM placed INTO @id, @total;
  END;
  CLOSE placed;
  DEALLOCATE placed;
END;`);
    },
    async insertOrder(id, total) {
      await request()
        .input('id', sql.BigInt, id)
        .input('total', sql.Decimal(18, 2), total)
        .query(`INSERT INTO ${s}.[Orders] ([Id], [Total]) VALUES (@id, @total);`);
    },
    async asPrincipal(principal, work) {
      await session.begin();
      try {
        await request().batch(`EXECUTE AS USER = N'${principal}';`);
        try {
          return await work();
        } finally {
          await request().batch('REVERT;');
        }
      } finally {
        await end('rollback').catch(() => undefined);
      }
    },
    createPrincipal: async (principal) => void (await request().batch(`CREATE USER [${principal}] WITHOUT LOGIN;`)),
    async grantEnqueuer(principal) {
      for (const batch of mssqlEnqueueGrantsScript(schema, principal).split(/^GO$/m)) {
        if (batch.trim()) await request().batch(batch);
      }
    },
    readJobs: () => request().query(`SELECT COUNT(*) AS [Count] FROM ${s}.[Jobs];`),
    close: () => pool.close(),
  };
  return session;
}

describeEachMssqlDatabase('SQL enqueue', (db) => {
  describeSqlEnqueueContract({
    name: `mssql ${db.label}`,
    openStore: async (schema) => createMssqlStore({ url: db.url, poolSize: 4 }, { schema }),
    connect: (schema) => mssqlSession(db, schema),
    refusalMessage(error) {
      expect(mssqlErrorNumber(error)).toBe(MSSQL_ENQUEUE_REFUSED);
      return (error as Error).message;
    },
    notPermitted: /EXECUTE permission was denied on the object 'Enqueue'/,
    dropSchema: (schema) => dropMssqlSchema(db.url, schema),
    async dropPrincipal(principal) {
      const pool = await openMssqlPool(db.url, 1);
      try {
        await pool.request().batch(`IF USER_ID(N'${principal}') IS NOT NULL DROP USER [${principal}];`);
      } finally {
        await pool.close();
      }
    },
  });

  it('server fact: the procedure refuses what only T-SQL can pass (U+0000, a lone surrogate, a scalar payload)', async () => {
    const schema = uniqueSchema('sqlenqfacts');
    const store = createMssqlStore({ url: db.url, poolSize: 2 }, { schema });
    const session = await mssqlSession(db, schema);
    try {
      await store.migrate('auto');
      const refusal = (call: SqlEnqueueCall) =>
        session.enqueue(call).then(
          () => 'accepted',
          (error: unknown) => `${mssqlErrorNumber(error)}: ${(error as Error).message}`,
        );
      expect(await refusal({ queue: 'facts', payload: {}, options: { groupKey: 'a\u0000b' } })).toBe(
        `${MSSQL_ENQUEUE_REFUSED}: enqueue to 'facts': groupKey contains U+0000 or an unpaired surrogate, which cannot be stored as text`,
      );
      expect(await refusal({ queue: 'facts', payload: {}, options: { idempotencyKey: 'a\ud800' } })).toBe(
        `${MSSQL_ENQUEUE_REFUSED}: enqueue to 'facts': idempotencyKey contains U+0000 or an unpaired surrogate, which cannot be stored as text`,
      );
      // A pair is one character, not a lone surrogate.
      expect(await refusal({ queue: 'facts', payload: {}, options: { idempotencyKey: 'a😀' } })).toBe('accepted');
      // IMPLICIT_TRANSACTIONS ON with no transaction yet: refused, since the job would commit alone.
      const implicit = await openMssqlPool(db.url, 1);
      try {
        await implicit.request().batch('SET IMPLICIT_TRANSACTIONS ON;');
        await expect(
          bindEnqueueCall(implicit.request(), { queue: 'facts', payload: {} }).execute(`[${schema}].[Enqueue]`),
        ).rejects.toThrow(/called with IMPLICIT_TRANSACTIONS ON and no transaction open/);
        await implicit.request().batch('IF @@TRANCOUNT > 0 ROLLBACK; SET IMPLICIT_TRANSACTIONS OFF;');
      } finally {
        await implicit.close();
      }
      // A refusal inside a trigger reaches the caller: as the error, or among mssql's precedingErrors
      // when the server reports the trigger's end after it.
      const triggered = await openMssqlPool(db.url, 1);
      try {
        await triggered.request().batch(`CREATE TABLE [${schema}].[Refused] ([Id] int NOT NULL);`);
        await triggered.request()
          .batch(`CREATE TRIGGER [${schema}].[RefusedPlaced] ON [${schema}].[Refused] AFTER INSERT AS
BEGIN
  SET NOCOUNT ON;
  EXEC [${schema}].[Enqueue] @Queue = N'facts', @Payload = N'{}', @Priority = 40000;
END;`);
        const error = await triggered
          .request()
          .query(`INSERT INTO [${schema}].[Refused] ([Id]) VALUES (1);`)
          .then(
            () => null,
            (e: unknown) => e as Error & { precedingErrors?: Error[] },
          );
        const messages = [error?.message, ...(error?.precedingErrors ?? []).map((e) => e.message)];
        expect(messages).toContain("enqueue to 'facts': priority must be an integer from -32768 to 32767, got 40000");
        expect(
          (await triggered.request().query<{ N: number }>(`SELECT COUNT(*) AS [N] FROM [${schema}].[Refused];`))
            .recordset[0]!.N,
        ).toBe(0);
      } finally {
        await triggered.close();
      }
      // A caller without the options filtered indexes need (an old client's session): the procedure sets them.
      const pool = await openMssqlPool(db.url, 1);
      try {
        await pool.request().batch('SET ANSI_WARNINGS OFF; SET ARITHABORT OFF; SET CONCAT_NULL_YIELDS_NULL OFF;');
        const result = await bindEnqueueCall(pool.request(), { queue: 'facts', payload: { old: 'client' } }).execute(
          `[${schema}].[Enqueue]`,
        );
        expect(result.output.Created).toBe(true);
      } finally {
        await pool.close();
      }
      expect(await refusal({ queue: 'facts', payload: {}, options: { idempotencyKey: '\udc00a' } })).toMatch(
        /idempotencyKey contains U\+0000 or an unpaired surrogate/,
      );
      expect(await refusal({ queue: 'facts', payload: {}, options: { groupKey: 'a\ud800b' } })).toMatch(
        /groupKey contains U\+0000 or an unpaired surrogate/,
      );
      const raw = (payloadText: string) => refusal({ queue: 'facts', payload: null, payloadText });
      expect(await raw(' null ')).toBe('accepted'); // JSON null, as SQL NULL stores it
      expect(await raw('{"smile":"\\ud83d\\ude00"}')).toBe('accepted'); // an escaped pair is one character
      expect(await raw('{"a":"\\ud83d x"}')).toMatch(/payload contains U\+0000 or an unpaired surrogate/);
      expect(await raw('42')).toMatch(/payload must be the JSON text of an object or an array \(ISJSON\), got '42'/);
      expect(await raw('{"a":"\\u0000"}')).toMatch(/payload contains U\+0000 or an unpaired surrogate/);
      expect(await raw('{"a":"\\\\u0000"}')).toBe('accepted'); // an escaped backslash, then text
      expect(await raw('{"a":"\\udc00"}')).toMatch(/payload contains U\+0000 or an unpaired surrogate/);
    } finally {
      await session.close();
      await store.close();
      await dropMssqlSchema(db.url, schema);
    }
  });
});
