import sql from 'mssql';
import { describe, expect, it } from 'vitest';
import { isMssqlRefusal } from '../../lib/src/store/mssql/mssql.errors.js';

/** mssql's RequestError as it wraps a tedious error that carries the server's info. */
function serverError(number: number, severity: number): Error {
  return new sql.RequestError(
    Object.assign(new Error(`server error ${number}`), { info: { number, class: severity } }),
  );
}

describe('SQL Server refusals: the server raised an error in an atomic batch, so nothing was stored', () => {
  it('counts constraint, duplicate-key and deadlock errors as refusals', () => {
    expect(isMssqlRefusal(serverError(547, 16))).toBe(true); // CHECK/foreign key
    expect(isMssqlRefusal(serverError(2627, 14))).toBe(true); // duplicate key
    expect(isMssqlRefusal(serverError(1205, 13))).toBe(true); // deadlock victim: rolled back
  });

  it('never counts a lost connection, a client timeout or a fatal error: the outcome is unknown', () => {
    expect(isMssqlRefusal(new sql.RequestError('Timeout: Request failed to complete in 30000ms', 'ETIMEOUT'))).toBe(
      false,
    );
    expect(isMssqlRefusal(new sql.ConnectionError('Connection lost - read ECONNRESET', 'ESOCKET'))).toBe(false);
    expect(isMssqlRefusal(new sql.RequestError('Connection closed before request completed.', 'ECLOSE' as never))).toBe(
      false,
    );
    expect(isMssqlRefusal(serverError(10054, 20))).toBe(false); // transport failure
    expect(isMssqlRefusal(serverError(40613, 17))).toBe(false); // database unavailable (Azure)
    expect(isMssqlRefusal(serverError(823, 24))).toBe(false); // severity 20 and above ends the connection
    expect(isMssqlRefusal(new Error('plain'))).toBe(false);
  });
});
