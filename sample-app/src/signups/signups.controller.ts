import { BadRequestException, Body, ConflictException, Controller, Inject, Post } from '@nestjs/common';
import { QueueProducer } from 'nestjs-sql-queue';
import { SampleDatabase } from '../database/sample.database.js';
import { EMAILS_QUEUE, type SendEmailJob } from '../emails/send-email.job.js';

/** Result of a signup: the business row and the welcome email job committed with it. */
export interface SignupResult {
  signupId: string;
  jobId: string;
}

@Controller('signups')
export class SignupsController {
  constructor(
    @Inject(SampleDatabase) private readonly db: SampleDatabase,
    private readonly producer: QueueProducer,
  ) {}

  /**
   * Writes the signup and enqueues its welcome email in one transaction: both commit, or
   * neither does (a duplicate email address rolls the job back with the row, answering 409).
   */
  @Post()
  async create(@Body() body: { email?: unknown; name?: unknown }): Promise<SignupResult> {
    const email = typeof body?.email === 'string' ? body.email.trim() : '';
    const name = typeof body?.name === 'string' ? body.name.trim() : '';
    if (!/^[^@\s]+@[^@\s]+$/.test(email) || email.length > 320) {
      throw new BadRequestException('email must be an email address');
    }
    if (name.length === 0 || name.length > 200) throw new BadRequestException('name must be 1 to 200 characters');
    let result: SignupResult;
    try {
      result = await this.db.transaction(async (tx) => {
        const [row] = await tx.query<{ id: string }>(this.db.sql.insertSignup, [email, name]);
        const job: SendEmailJob = { to: email, subject: `Welcome, ${name}`, text: 'Thanks for signing up.' };
        const { jobId } = await this.producer.enqueue(EMAILS_QUEUE, job, {
          idempotencyKey: `welcome:${row!.id}`,
          transaction: tx.handle,
        });
        return { signupId: String(row!.id), jobId };
      });
    } catch (error) {
      if (this.db.isUniqueViolation(error)) throw new ConflictException(`${email} has already signed up`);
      throw error;
    }
    // The enqueue woke local readers before the commit, when the job was not visible yet:
    // wake them (and other instances) again now that it is.
    this.producer.wake(EMAILS_QUEUE);
    return result;
  }
}
