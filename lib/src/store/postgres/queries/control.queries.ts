// Job control: pausing and resuming queues.
import type { PgTables } from './tables.js';

// $1 queue, $2 reason. A row when this statement paused the queue; none when it was paused
// already (the first pause and its reason stay). A concurrent pause of the same queue waits for
// the first one's commit and then does nothing.
export function pauseQueue(t: PgTables): string {
  const { pauses } = t;
  return `INSERT INTO ${pauses} (queue, reason) VALUES ($1, $2)
ON CONFLICT (queue) DO NOTHING
RETURNING queue`;
}

// $1 queue. A row when the queue was paused.
export function resumeQueue(t: PgTables): string {
  const { pauses } = t;
  return `DELETE FROM ${pauses} WHERE queue = $1 RETURNING queue`;
}

export function listPausedQueues(t: PgTables): string {
  const { pauses } = t;
  return `SELECT queue, reason, paused_at FROM ${pauses} ORDER BY queue`;
}
