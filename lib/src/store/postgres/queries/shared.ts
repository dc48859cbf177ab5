// Fragments more than one capability's statements use.
import type { PgTables } from './tables.js';

// Whether a queue's groups stop on a dead job (recorded by its consumers; 'continue' if none).
export function blocksOnDead(t: PgTables, queue: string): string {
  const { settings } = t;
  return `EXISTS (SELECT 1 FROM ${settings} s WHERE s.queue = ${queue} AND s.group_on_dead = 'block')`;
}

// True unless the queue is paused: an uncorrelated probe of queue_pauses' primary key, which the
// planner runs once per statement (an InitPlan) and which gates the scans it guards.
export function notPaused(t: PgTables, queue: string): string {
  const { pauses } = t;
  return `NOT EXISTS (SELECT 1 FROM ${pauses} p WHERE p.queue = ${queue})`;
}
