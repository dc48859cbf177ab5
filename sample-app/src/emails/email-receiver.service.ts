import { Inject, Injectable } from '@nestjs/common';
import { SampleDatabase } from '../database/sample.database.js';

/** One email as the receiver recorded it. */
export interface SentEmail {
  idempotencyKey: string;
  recipient: string;
  subject: string;
  jobId: string;
  attempt: number;
  sentAt: Date;
}

/**
 * Stands in for a mail provider that deduplicates by a business key. A lease cannot promise
 * that a handler runs once (a worker can send and die before recording the completion), so
 * the effect goes through a receiver keyed by the job's idempotency key: a second delivery of
 * the same key changes nothing.
 */
@Injectable()
export class EmailReceiver {
  constructor(@Inject(SampleDatabase) private readonly db: SampleDatabase) {}

  /** Records the email once per key; true when this call was the first delivery. */
  async deliver(key: string, email: { to: string; subject: string }, jobId: string, attempt: number): Promise<boolean> {
    const [row] = await this.db.query<{ inserted: number }>(this.db.sql.recordSent, [
      key,
      email.to,
      email.subject,
      jobId,
      attempt,
    ]);
    return Number(row?.inserted ?? 0) > 0;
  }

  async recent(limit: number): Promise<SentEmail[]> {
    return this.db.query<SentEmail>(this.db.sql.listSent, [limit]);
  }
}
