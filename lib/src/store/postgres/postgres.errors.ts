/**
 * SQLSTATE classes and node-level failures after which a statement may simply be tried again
 * later: the connection went away, the server is restarting, or a lock could not be taken.
 */
const TRANSIENT_SQLSTATES = new Set([
  '40001', // serialization_failure
  '40P01', // deadlock_detected
  '55P03', // lock_not_available
  '57P01', // admin_shutdown
  '57P02', // crash_shutdown
  '57P03', // cannot_connect_now
  '53300', // too_many_connections
  '53400', // configuration_limit_exceeded
]);

const TRANSIENT_NODE_CODES = new Set(['ECONNREFUSED', 'ECONNRESET', 'ETIMEDOUT', 'EPIPE', 'ENOTFOUND', 'EAI_AGAIN']);

const TRANSIENT_MESSAGES = [
  'Connection terminated',
  'connection timeout',
  'timeout exceeded when trying to connect',
  'Client has encountered a connection error',
  'the database system is starting up',
  'the database system is shutting down',
  'terminating connection',
  // node-postgres's own query_timeout: the statement's outcome is unknown, as after a lost connection.
  'Query read timeout',
];

/**
 * An error the server sent (an ErrorResponse: severity and SQLSTATE): the statement failed on the
 * server, and in autocommit or in the store's own transaction it was rolled back. Errors of the
 * client or the socket (connection lost, node-postgres's query_timeout) carry no severity: their
 * statement's outcome is unknown.
 */
export function isPgRefusal(error: unknown): boolean {
  if (!error || typeof error !== 'object') return false;
  const { severity, code } = error as { severity?: unknown; code?: unknown };
  return typeof severity === 'string' && typeof code === 'string' && /^[0-9A-Z]{5}$/.test(code);
}

export function isTransientPgError(error: unknown): boolean {
  if (!error || typeof error !== 'object') return false;
  const { code, message } = error as { code?: unknown; message?: unknown };
  if (typeof code === 'string') {
    if (TRANSIENT_SQLSTATES.has(code) || code.startsWith('08') || TRANSIENT_NODE_CODES.has(code)) return true;
  }
  return typeof message === 'string' && TRANSIENT_MESSAGES.some((fragment) => message.includes(fragment));
}
