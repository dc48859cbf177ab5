import { Injectable, Logger } from '@nestjs/common';
import { QueueHandler, type JobContext, type QueueJobHandler } from 'nestjs-sql-queue';
import { EmailReceiver } from './email-receiver.service.js';
import { EMAILS_QUEUE, type SendEmailJob } from './send-email.job.js';

/**
 * Sends emails from the queue. It runs after the claim committed, outside any transaction,
 * and "sends" through the idempotent receiver keyed by the job's idempotency key, so a retry
 * after a crash (or a second enqueue of the same key) never sends twice.
 */
@QueueHandler(EMAILS_QUEUE, {
  maxReaders: 4,
  maxAttempts: 5,
  backoff: { type: 'exponential', baseMs: 200, maxMs: 5_000 },
})
@Injectable()
export class SendEmailHandler implements QueueJobHandler<SendEmailJob> {
  private readonly logger = new Logger(SendEmailHandler.name);

  constructor(private readonly receiver: EmailReceiver) {}

  async handle(email: SendEmailJob, context: JobContext): Promise<void> {
    if (email.failTimes !== undefined && context.attempt <= email.failTimes) {
      throw new Error(`simulated delivery failure (attempt ${context.attempt} of ${email.failTimes} planned failures)`);
    }
    const key = context.idempotencyKey ?? `job:${context.jobId}`;
    const first = await this.receiver.deliver(key, email, context.jobId, context.attempt);
    this.logger.log(
      `job ${context.jobId} in queue '${context.queue}': ${first ? 'sent' : 'already sent, nothing to do'} (key ${key}, attempt ${context.attempt})`,
    );
  }
}
