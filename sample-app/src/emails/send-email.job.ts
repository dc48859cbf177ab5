import { BadRequestException } from '@nestjs/common';

/** The queue the sample's emails go through. */
export const EMAILS_QUEUE = 'emails';

/** Payload of one email job. */
export interface SendEmailJob {
  to: string;
  subject: string;
  text: string;
  /** Demo knob: the handler fails this many attempts before it sends (shows retries in the metrics). */
  failTimes?: number;
}

function text(body: Record<string, unknown>, field: string, max: number, required = true): string | undefined {
  const value = body[field];
  if (value === undefined && !required) return undefined;
  if (typeof value !== 'string' || value.trim().length === 0 || value.length > max) {
    throw new BadRequestException(`${field} must be a non-empty string of at most ${max} characters`);
  }
  return value;
}

/** Checks a request body before anything is written; 400 with the field that is wrong. */
export function parseEmailRequest(raw: unknown): SendEmailJob & { idempotencyKey?: string; delayMs?: number } {
  if (!raw || typeof raw !== 'object' || Array.isArray(raw)) throw new BadRequestException('expected a JSON object');
  const body = raw as Record<string, unknown>;
  const to = text(body, 'to', 320)!;
  if (!/^[^@\s]+@[^@\s]+$/.test(to)) throw new BadRequestException('to must be an email address');
  const job: SendEmailJob & { idempotencyKey?: string; delayMs?: number } = {
    to,
    subject: text(body, 'subject', 200)!,
    text: text(body, 'text', 10_000, false) ?? '',
  };
  const idempotencyKey = text(body, 'idempotencyKey', 255, false);
  if (idempotencyKey !== undefined) job.idempotencyKey = idempotencyKey;
  for (const field of ['failTimes', 'delayMs'] as const) {
    const value = body[field];
    if (value === undefined) continue;
    if (!Number.isInteger(value) || (value as number) < 0 || (value as number) > 86_400_000) {
      throw new BadRequestException(`${field} must be a non-negative integer`);
    }
    job[field] = value as number;
  }
  return job;
}
