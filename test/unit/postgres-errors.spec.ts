import { describe, expect, it } from 'vitest';
import { isTransientPgError } from '../../lib/src/store/postgres/postgres.errors.js';

describe('PostgreSQL errors worth a retry after a pause', () => {
  it("counts node-postgres's query_timeout as transient: the statement's outcome is unknown", () => {
    // The batcher gives every caller a transient error as it is, and splits a batch only on a refusal:
    // a job whose statement may have committed must not be sent again.
    expect(isTransientPgError(new Error('Query read timeout'))).toBe(true);
    expect(isTransientPgError(new Error('Connection terminated unexpectedly'))).toBe(true);
    expect(isTransientPgError(Object.assign(new Error('value too long'), { code: '22001' }))).toBe(false);
  });
});
