import type { JobRecord } from '../../lib/src/core/types.js';

/** A dead job as the store lists it (five attempts spent, last error 'boom'), with `fields` over it. */
export function deadJobRecord(fields: Partial<JobRecord> & Pick<JobRecord, 'id' | 'queue' | 'payload'>): JobRecord {
  return {
    state: 'dead',
    priority: 0,
    runAt: new Date(0),
    groupKey: null,
    idempotencyKey: null,
    concurrencyKey: null,
    attempts: 5,
    maxAttempts: 5,
    claimToken: null,
    leaseUntil: null,
    workerId: null,
    createdAt: new Date(0),
    claimedAt: null,
    finishedAt: new Date(1),
    lastError: 'boom',
    cancelRequestedAt: null,
    cancelReason: null,
    result: null,
    progress: null,
    ...fields,
  };
}
