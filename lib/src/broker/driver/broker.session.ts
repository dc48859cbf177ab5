import type { BrokerSession } from '../broker.types.js';

/**
 * Ends a receiving transaction after a failure without rolling back what it received: commit;
 * only when the server refuses (a doomed transaction, a lost connection) roll back. Service
 * Broker disables a queue after five rolled-back receives in a row, and a received message is
 * worth less than the queue (rings, notifications and initiator messages are all recoverable).
 */
export async function commitOrRollback(session: BrokerSession): Promise<void> {
  try {
    await session.commit();
  } catch {
    await session.rollback().catch(() => undefined);
  }
}
