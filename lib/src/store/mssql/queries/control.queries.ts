// Job control: pausing and resuming queues.
import { MSSQL_STORE_SESSION } from './session.js';
import type { MssqlTables } from './tables.js';

// @queue, @reason. A row when this statement paused the queue; none when it was paused already
// (the first pause and its reason stay). UPDLOCK, HOLDLOCK keep the key, or the range it would go
// in, to the end of the statement, so two pauses of one queue at once serialize: the second sees
// the first one's row and inserts nothing, instead of failing on the primary key.
export function pauseQueue(t: MssqlTables): string {
  const { pauses } = t;
  return `${MSSQL_STORE_SESSION}INSERT INTO ${pauses} ([Queue], [Reason])
OUTPUT inserted.[Queue]
SELECT @queue, @reason
WHERE NOT EXISTS (SELECT 1 FROM ${pauses} WITH (UPDLOCK, HOLDLOCK) WHERE [Queue] = @queue);`;
}

// @queue. A row when the queue was paused.
export function resumeQueue(t: MssqlTables): string {
  const { pauses } = t;
  return `${MSSQL_STORE_SESSION}DELETE FROM ${pauses}
OUTPUT deleted.[Queue]
WHERE [Queue] = @queue;`;
}

// READPAST, as the claims read pauses: a pause not committed yet is not listed.
export function listPausedQueues(t: MssqlTables): string {
  const { pauses } = t;
  return `${MSSQL_STORE_SESSION}SELECT [Queue], [Reason], [PausedAt]
FROM ${pauses} WITH (READPAST, READCOMMITTEDLOCK)
ORDER BY [Queue];`;
}
