import { describe, expect, it } from 'vitest';
import { isPgRefusal, isTransientPgError } from '../../lib/src/store/postgres/postgres.errors.js';

describe('PostgreSQL errors worth a retry after a pause', () => {
  it("counts node-postgres's query_timeout as transient: the statement's outcome is unknown", () => {
    // The batcher gives every caller a transient error as it is, and splits a batch only on a refusal:
    // a job whose statement may have committed must not be sent again.
    expect(isTransientPgError(new Error('Query read timeout'))).toBe(true);
    expect(isTransientPgError(new Error('Connection terminated unexpectedly'))).toBe(true);
    expect(isTransientPgError(Object.assign(new Error('value too long'), { code: '22001' }))).toBe(false);
  });
});

describe('PostgreSQL refusals: the server answered with an error, so nothing was stored', () => {
  it('tells a server error from a client or socket error, on PGlite and on node-postgres shapes', async () => {
    const { PGlite } = await import('@electric-sql/pglite');
    const db = new PGlite();
    try {
      const refused = await db.query('SELECT 1 / 0').catch((error: unknown) => error);
      expect(isPgRefusal(refused)).toBe(true);
    } finally {
      await db.close();
    }
    // node-postgres: DatabaseError carries the server's severity and SQLSTATE.
    expect(isPgRefusal(Object.assign(new Error('deadlock detected'), { severity: 'ERROR', code: '40P01' }))).toBe(true);
    expect(isPgRefusal(Object.assign(new Error('canceling statement'), { severity: 'ERROR', code: '57014' }))).toBe(
      true,
    );
    // The outcome is unknown: the socket went away, or the client stopped waiting.
    expect(isPgRefusal(new Error('Query read timeout'))).toBe(false);
    expect(isPgRefusal(new Error('Connection terminated unexpectedly'))).toBe(false);
    expect(isPgRefusal(Object.assign(new Error('write EPIPE'), { code: 'EPIPE' }))).toBe(false);
    expect(isPgRefusal(Object.assign(new Error('read ECONNRESET'), { code: 'ECONNRESET' }))).toBe(false);
    expect(isPgRefusal(null)).toBe(false);
  });
});
