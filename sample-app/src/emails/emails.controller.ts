import { Body, Controller, Get, Headers, HttpCode, Post, Query } from '@nestjs/common';
import { QueueProducer, type EnqueueResult } from 'nestjs-sql-queue';
import { EmailReceiver, type SentEmail } from './email-receiver.service.js';
import { EMAILS_QUEUE, parseEmailRequest, type SendEmailJob } from './send-email.job.js';

@Controller('emails')
export class EmailsController {
  constructor(
    private readonly producer: QueueProducer,
    private readonly receiver: EmailReceiver,
  ) {}

  /**
   * Enqueues an email. The idempotency key comes from the `Idempotency-Key` header (or the
   * body's `idempotencyKey`): posting the same key again returns the first job
   * (`created: false`) and the email is sent once.
   */
  @Post()
  @HttpCode(202)
  async send(@Body() body: unknown, @Headers('idempotency-key') header?: string): Promise<EnqueueResult> {
    const { idempotencyKey, delayMs, ...email } = parseEmailRequest(body);
    const key = header?.trim() || idempotencyKey;
    const job: SendEmailJob = email;
    return this.producer.enqueue(EMAILS_QUEUE, job, {
      ...(key ? { idempotencyKey: key } : {}),
      ...(delayMs !== undefined ? { delayMs } : {}),
    });
  }

  /** What the receiver recorded, newest first: one row per idempotency key. */
  @Get('sent')
  sent(@Query('limit') limit?: string): Promise<SentEmail[]> {
    const n = Math.min(Math.max(Number(limit) || 50, 1), 500);
    return this.receiver.recent(n);
  }
}
