/**
 * The SQL enqueue's definitions (issue 25) as text: released migration versions never change, the
 * procedure's parameters never collide with the variables of the enqueue it embeds, and the
 * embedded statements cannot end the dollar quotes around them. Their behaviour is proven on
 * PostgreSQL in test/integration/sql-enqueue.postgres.spec.ts and on SQL Server by the live suite
 * (test/integration/mssql/sql-enqueue.mssql.spec.ts); the T-SQL grammar checks the procedure with
 * every migration batch (mssql-grammar.spec.ts).
 */
import { createHash } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { MSSQL_MIGRATIONS } from '../../lib/src/store/mssql/mssql.migrations.js';
import { mssqlEnqueueProcedure } from '../../lib/src/store/mssql/queries/enqueue-procedure.queries.js';
import { PG_MIGRATIONS } from '../../lib/src/store/postgres/postgres.migrations.js';

const sha = (text: string) => createHash('sha256').update(text).digest('hex');

describe('the SQL enqueue definitions', () => {
  it('PostgreSQL version 12 and SQL Server version 16 are released and never edited', () => {
    // A change to an enqueue statement they embed changes these: freeze the old text in the
    // migration and replace the function or procedure in a new version instead.
    expect(
      sha(
        PG_MIGRATIONS.find((m) => m.version === 12)!
          .statements('sqlqueue')
          .join('\n'),
      ),
    ).toBe('040fb16252f936009090226b980c6b8c16828ec3016c7710960ae8ac7a7acb60');
    expect(
      sha(
        MSSQL_MIGRATIONS.find((m) => m.version === 16)!
          .batches('sqlqueue')
          .join('\n'),
      ),
    ).toBe('70329957a30afb53ec0c41ab342bdf3cd94aab0b27f5fff2299fa3079f745a30');
  });

  it('PostgreSQL version 13 and SQL Server version 17 (the scale recommendation) are released and never edited', () => {
    expect(
      sha(
        PG_MIGRATIONS.find((m) => m.version === 13)!
          .statements('sqlqueue')
          .join('\n'),
      ),
    ).toBe('d885c1a3c82d28284846391fb3559e0c940583557b640326a1888786385712eb');
    expect(
      sha(
        MSSQL_MIGRATIONS.find((m) => m.version === 17)!
          .batches('sqlqueue')
          .join('\n'),
      ),
    ).toBe('8544d64d8f0b6b30f59a29fd88929101524208ae9eaa6cfb53f980c51353796c');
  });

  it("the procedure's parameters are none of the variables of the enqueue it embeds (names compare without case)", () => {
    const text = mssqlEnqueueProcedure('sqlqueue');
    const header = text.slice(0, text.indexOf('WITH EXECUTE AS OWNER'));
    const parameters = [...header.matchAll(/^\s+(@\w+)/gm)].map((m) => m[1]!.toLowerCase());
    expect(parameters).toContain('@queue');
    expect(parameters).toHaveLength(11);
    const declared = [...text.slice(header.length).matchAll(/\bDECLARE\s[\s\S]*?;/g)].flatMap((statement) =>
      [...statement[0].matchAll(/(?<![@\w])@\w+/g)].map((m) => m[0].toLowerCase()),
    );
    expect(declared).toEqual(expect.arrayContaining(['@firstid', '@inserted', '@keys', '@jobs', '@intransaction']));
    expect(declared.filter((name) => parameters.includes(name))).toEqual([]);
  });

  it('both are ASCII, so sqlcmd and psql read the printed scripts alike in any code page or client encoding', () => {
    const ascii = {
      test: (text: string) => [...text].every((c) => c === '\t' || c === '\n' || (c >= ' ' && c <= '~')),
    };
    expect(ascii.test(mssqlEnqueueProcedure('sqlqueue'))).toBe(true);
    expect(
      ascii.test(
        PG_MIGRATIONS.find((m) => m.version === 12)!
          .statements('sqlqueue')
          .join('\n'),
      ),
    ).toBe(true);
  });

  it("the function's embedded statements hold no dollar quote of their own", () => {
    const [definition] = PG_MIGRATIONS.find((m) => m.version === 12)!.statements('sqlqueue');
    const body = definition!.slice(
      definition!.indexOf('$enqueue$') + '$enqueue$'.length,
      definition!.lastIndexOf('$enqueue$'),
    );
    expect(body).not.toContain('$enqueue$');
    const embedded = body.split('$statement$').filter((_, i) => i % 2 === 1);
    expect(embedded.length).toBe(4);
    for (const statement of embedded) expect(statement).not.toMatch(/\$\w*\$/);
  });
});
