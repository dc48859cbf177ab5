import { prepareJob } from '../../lib/src/core/producer/job-validation.js';
import type { EnqueueOptions } from '../../lib/src/core/types.js';
import { DEFAULT_MAX_ATTEMPTS, DEFAULT_MAX_PAYLOAD_BYTES } from '../../lib/src/core/validation.js';

/** One call of the SQL enqueue (function or procedure), in producer.enqueue's terms. */
export interface SqlEnqueueCall {
  queue: string | null;
  /** Sent as JSON text (JSON.stringify), as a trigger would build it. */
  payload: unknown;
  /** Sent as it is instead of `payload`: text only SQL can pass. */
  payloadText?: string;
  options?: EnqueueOptions;
}

/** What producer.enqueue says of the same call: its validation message, or null when it is accepted. */
export function producerRefusal(call: SqlEnqueueCall): string | null {
  try {
    prepareJob(call.queue as string, call.payload, call.options, {
      maxPayloadBytes: DEFAULT_MAX_PAYLOAD_BYTES,
      defaultMaxAttempts: DEFAULT_MAX_ATTEMPTS,
    });
    return null;
  } catch (error) {
    return (error as Error).message;
  }
}

const MAX_DELAY_MS = 50 * 365 * 86_400_000;

/** Bad arguments each dialect must refuse with producer.enqueue's own message. */
export const REFUSED_CALLS: readonly { name: string; call: SqlEnqueueCall }[] = [
  { name: 'a queue name with a space', call: { queue: 'bad queue', payload: {} } },
  { name: 'an empty queue name', call: { queue: '', payload: {} } },
  { name: 'a queue name of 129 characters', call: { queue: 'q'.repeat(129), payload: {} } },
  { name: 'no queue', call: { queue: null, payload: {} } },
  {
    name: 'a payload over the default limit',
    // An array: SQL Server's procedure takes objects and arrays, and jsonb's text of it has no extra spaces.
    call: { queue: 'sqlq', payload: ['x'.repeat(DEFAULT_MAX_PAYLOAD_BYTES)] },
  },
  { name: 'runAt and delayMs', call: { queue: 'sqlq', payload: {}, options: { runAt: new Date(), delayMs: 5 } } },
  { name: 'a negative delay', call: { queue: 'sqlq', payload: {}, options: { delayMs: -1 } } },
  { name: 'a delay past 50 years', call: { queue: 'sqlq', payload: {}, options: { delayMs: MAX_DELAY_MS + 1 } } },
  { name: 'priority 40000', call: { queue: 'sqlq', payload: {}, options: { priority: 40_000 } } },
  { name: 'priority -40000', call: { queue: 'sqlq', payload: {}, options: { priority: -40_000 } } },
  { name: 'maxAttempts 0', call: { queue: 'sqlq', payload: {}, options: { maxAttempts: 0 } } },
  { name: 'maxAttempts 10001', call: { queue: 'sqlq', payload: {}, options: { maxAttempts: 10_001 } } },
  { name: 'an empty group key', call: { queue: 'sqlq', payload: {}, options: { groupKey: '' } } },
  {
    name: 'a group key of 256 characters',
    call: { queue: 'sqlq', payload: {}, options: { groupKey: 'g'.repeat(256) } },
  },
  {
    name: 'a group key of 128 emoji (256 UTF-16 units)',
    call: { queue: 'sqlq', payload: {}, options: { groupKey: '😀'.repeat(128) } },
  },
  { name: 'a group key ending with a space', call: { queue: 'sqlq', payload: {}, options: { groupKey: 'g ' } } },
  // THROW reads % as a format character unless doubled.
  {
    name: 'a group key with % ending with a space',
    call: { queue: 'sqlq', payload: {}, options: { groupKey: '50% off ' } },
  },
  { name: 'a group key ending with a tab', call: { queue: 'sqlq', payload: {}, options: { groupKey: 'g\t' } } },
  {
    name: 'a group key ending with an ideographic space',
    call: { queue: 'sqlq', payload: {}, options: { groupKey: 'g\u3000' } },
  },
  {
    name: 'a concurrency key ending with NBSP',
    call: { queue: 'sqlq', payload: {}, options: { concurrencyKey: 'c\u00a0' } },
  },
  {
    name: 'a group key and a concurrency key',
    call: { queue: 'sqlq', payload: {}, options: { groupKey: 'g', concurrencyKey: 'c' } },
  },
  {
    name: 'an idempotency key of 300 characters',
    call: { queue: 'sqlq', payload: {}, options: { idempotencyKey: 'k'.repeat(300) } },
  },
  {
    name: "an idempotency key with the schedules' prefix",
    call: { queue: 'sqlq', payload: {}, options: { idempotencyKey: 'schedule:nightly:1' } },
  },
];
