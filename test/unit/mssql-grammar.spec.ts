import { describe, expect, it } from 'vitest';
import {
  MSSQL_MIGRATIONS,
  mssqlBootstrap,
  mssqlDropSchema,
  mssqlInstallScript,
  mssqlMigrationLock,
  mssqlReadVersion,
  mssqlRecordVersion,
} from '../../lib/src/store/mssql/mssql.migrations.js';
import { mssqlQueries } from '../../lib/src/store/mssql/mssql.queries.js';
import { checkTsqlWithKnownGaps } from '../helpers/tsql-grammar.js';

/** Every batch the SQL Server store can send, for a default and an unusual (valid) schema name. */
function everyBatch(schema: string): [string, string][] {
  const batches: [string, string][] = Object.entries(mssqlQueries(schema)).map(([name, text]) => [
    `query ${name}`,
    text,
  ]);
  mssqlBootstrap(schema).forEach((text, i) => batches.push([`bootstrap ${i}`, text]));
  for (const migration of MSSQL_MIGRATIONS) {
    migration.batches(schema).forEach((text, i) => batches.push([`migration ${migration.version}.${i}`, text]));
  }
  batches.push(['migration lock', mssqlMigrationLock()]);
  batches.push(['read version', mssqlReadVersion(schema)]);
  batches.push(['record version', mssqlRecordVersion(schema)]);
  batches.push(['drop schema', mssqlDropSchema()]);
  mssqlInstallScript(schema)
    .split(/^GO$/m)
    .forEach((text, i) => batches.push([`install script batch ${i}`, text]));
  return batches;
}

describe('every T-SQL batch the SQL Server store emits parses as T-SQL', () => {
  for (const schema of ['sqlqueue', 'Queue_Schema_2']) {
    for (const [name, text] of everyBatch(schema)) {
      it(`${name} (schema ${schema})`, () => {
        expect(checkTsqlWithKnownGaps(text).errors).toEqual([]);
      });
    }
  }

  it('the gate rejects a store statement that a PostgreSQL habit broke', () => {
    const claim = mssqlQueries('sqlqueue').claim;
    const broken = claim
      .replace('SELECT TOP (@limit) *', 'SELECT *')
      .replace('ORDER BY [Priority] DESC, [RunAt], [Id]', 'ORDER BY [Priority] DESC LIMIT @limit');
    expect(broken).not.toBe(claim);
    expect(checkTsqlWithKnownGaps(broken).errors).not.toEqual([]);
  });
});

describe('isolation of the statements the SQL Server store runs on its own', () => {
  // A pooled connection keeps the isolation level its last transaction set (the driver never
  // resets it); READPAST fails with error 650 at SNAPSHOT or SERIALIZABLE.
  const queries = mssqlQueries('sqlqueue');
  const inCallerTransaction = new Set(['enqueueOne', 'enqueueMany']);

  it.each(
    Object.entries(queries).filter(
      ([name, text]) => !inCallerTransaction.has(name) && /READPAST|UPDATE|DELETE/.test(text),
    ),
  )('%s sets READ COMMITTED before it reads or writes', (_name, text) => {
    const set = text.indexOf('SET TRANSACTION ISOLATION LEVEL READ COMMITTED;');
    expect(set).toBeGreaterThanOrEqual(0);
    const firstWork = text.search(/\b(SELECT|UPDATE|DELETE|INSERT|WITH)\b/);
    expect(set).toBeLessThan(firstWork);
  });

  it('enqueue statements leave the caller transaction’s isolation level alone', () => {
    for (const name of inCallerTransaction) {
      expect(queries[name as keyof typeof queries]).not.toMatch(/SET TRANSACTION ISOLATION LEVEL/);
    }
  });
});
