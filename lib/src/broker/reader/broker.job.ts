import { SqlQueueUnrecoverableError } from '../../core/errors.js';
import type { JobContext, JobHandler } from '../../core/consumer/index.js';
import type { JobRecord } from '../../core/types.js';
import { decodeBrokerBody, parseBrokerJson, SqlQueueBrokerBodyError } from '../broker.body.js';
import type {
  BrokerBodyFormat,
  BrokerDeadMessage,
  BrokerHandler,
  BrokerMessageContext,
  ResolvedBrokerQueue,
} from '../broker.types.js';

// A Service Broker message after a receiver moved it into the table queue (broker.receiver):
// one job per message, in the broker queue's table queue, in the ordered group of its
// conversation group. This file is the one place that knows the job's payload: the move
// statement writes it (FOR JSON, with BROKER_JOB_FIELDS as the names), the handler side reads it.

/**
 * The payload of a moved message's job. The body is `text` when the queue's format is 'json'
 * and the bytes are UTF-16LE text (what send() writes: readable in the dashboard, no base64
 * inflation), else `body`: the bytes in base64 (FOR JSON's encoding of varbinary). A body too
 * large to move is not kept: `droppedBytes` says how large it was, and its job dies at once.
 */
export interface BrokerJobPayload {
  /** message_type_name. */
  type: string;
  conversationHandle: string;
  conversationGroupId: string;
  /** message_sequence_number as decimal text. */
  sequence: string;
  text?: string;
  body?: string;
  droppedBytes?: number;
}

/** The payload's field names, for the move statement's FOR JSON aliases. */
export const BROKER_JOB_FIELDS: { readonly [K in keyof Required<BrokerJobPayload>]: K } = {
  type: 'type',
  conversationHandle: 'conversationHandle',
  conversationGroupId: 'conversationGroupId',
  sequence: 'sequence',
  text: 'text',
  body: 'body',
  droppedBytes: 'droppedBytes',
};

/**
 * The ceiling of the bytes of a body a move keeps (the module's maxPayloadBytes, which senders
 * obey too, is the limit; this is its own ceiling). The payload carries a kept body as base64
 * (4/3 of it) or as its text, and comes back to Node as one string, which cannot pass
 * buffer.constants.MAX_STRING_LENGTH (about 512 Mi characters on Node 20); larger bodies (a
 * T-SQL sender may send up to 2 GB) are moved without their bytes, as `droppedBytes`.
 */
export const BROKER_MOVE_MAX_KEPT_BYTES = 64 * 1024 * 1024;

/**
 * Reads a moved message's payload; throws SqlQueueUnrecoverableError for anything else (a job
 * enqueued into a broker queue's table queue by hand): it can never be handled.
 */
export function readBrokerJobPayload(queue: string, jobId: string, payload: unknown): BrokerJobPayload {
  const p = payload as Partial<Record<keyof BrokerJobPayload, unknown>> | null;
  const text = (key: keyof BrokerJobPayload) => typeof p?.[key] === 'string';
  if (
    !p ||
    typeof p !== 'object' ||
    !text('type') ||
    !text('conversationHandle') ||
    !text('conversationGroupId') ||
    !text('sequence') ||
    (p.text !== undefined && !text('text')) ||
    (p.body !== undefined && !text('body')) ||
    (p.droppedBytes !== undefined && typeof p.droppedBytes !== 'number')
  ) {
    throw new SqlQueueUnrecoverableError(
      `job ${jobId} in broker queue '${queue}' does not carry a received message (its payload is not what a receiver writes: was it enqueued by hand?)`,
    );
  }
  return p as BrokerJobPayload;
}

/** The body's bytes as the message carried them (null: none; also for a dropped body). */
export function brokerJobBytes(payload: BrokerJobPayload): Buffer | null {
  if (payload.text !== undefined) return Buffer.from(payload.text, 'utf16le');
  return payload.body === undefined ? null : Buffer.from(payload.body, 'base64');
}

/** The body handed to the handler, decoded per the queue's format; throws SqlQueueBrokerBodyError. */
function decodeMoved(format: BrokerBodyFormat, payload: BrokerJobPayload): unknown {
  // UTF-16LE text read by SQL Server: for 'json' it is the JSON text itself.
  if (payload.text !== undefined && format === 'json')
    return payload.text === '' ? null : parseBrokerJson(payload.text);
  return decodeBrokerBody(format, brokerJobBytes(payload));
}

export interface BrokerJobHandlerOptions {
  queue: ResolvedBrokerQueue;
  handler: BrokerHandler;
  /**
   * Ends our side of a conversation whose Close message (the recycle handshake) was reached:
   * every message its sender sent before Close has been handled, so the sender may begin the
   * key's next dialog. Ending one already ended succeeds.
   */
  endConversation(conversationHandle: string): Promise<void>;
  /** The most bytes of a body the moves keep (the module's maxPayloadBytes), for the error of a larger one. */
  maxBodyBytes: number;
}

/**
 * The table-queue handler of a broker queue's jobs: decodes the message and runs the
 * application's handler with the job's context and the message's origin. A Close message ends
 * its conversation instead (it reaches a handler only in the order of its group, after the
 * messages sent before it). A body that cannot be decoded, or was too large to move, fails the
 * job as unrecoverable: retrying cannot help, and the dead job keeps it for inspection.
 */
export function brokerJobHandler(options: BrokerJobHandlerOptions): JobHandler {
  const { queue, handler } = options;
  return async (payload: unknown, context: JobContext) => {
    const message = readBrokerJobPayload(queue.name, context.jobId, payload);
    if (message.type === queue.closeMessageType) {
      await options.endConversation(message.conversationHandle);
      return;
    }
    if (message.droppedBytes !== undefined) {
      throw new SqlQueueUnrecoverableError(
        `broker queue '${queue.name}': the body of message ${message.sequence} of conversation ${message.conversationHandle} is ${message.droppedBytes} bytes, more than a move keeps (maxPayloadBytes, ${options.maxBodyBytes}); it was not kept. Send large documents by reference`,
      );
    }
    let body: unknown;
    try {
      body = decodeMoved(queue.format, message);
    } catch (error) {
      if (!(error instanceof SqlQueueBrokerBodyError)) throw error;
      throw new SqlQueueUnrecoverableError(
        `broker queue '${queue.name}': ${error.message} (format '${queue.format}')`,
        { cause: error },
      );
    }
    // The job's context as it is (its signal stays lazy), with the message's origin.
    const brokerContext = Object.defineProperties(
      {
        conversationHandle: message.conversationHandle,
        conversationGroupId: message.conversationGroupId,
        messageTypeName: message.type,
        messageSequenceNumber: message.sequence,
      },
      Object.getOwnPropertyDescriptors(context),
    ) as BrokerMessageContext;
    await handler(body, brokerContext);
  };
}

/** A dead job of a broker queue as the message it carries (a body that no longer decodes: its bytes). */
export function brokerDeadMessage(queue: ResolvedBrokerQueue, job: JobRecord): BrokerDeadMessage {
  let message: BrokerJobPayload | null = null;
  try {
    message = readBrokerJobPayload(queue.name, job.id, job.payload);
  } catch {
    // Not a moved message: listed with what is known of it.
  }
  let body: unknown = job.payload;
  if (message?.droppedBytes !== undefined) body = null;
  else if (message) {
    try {
      body = decodeMoved(queue.format, message);
    } catch (error) {
      if (!(error instanceof SqlQueueBrokerBodyError)) throw error;
      // A body that killed its handler may well be malformed: listed as its bytes.
      body = brokerJobBytes(message) ?? Buffer.alloc(0);
    }
  }
  return {
    id: job.id,
    queue: job.queue,
    conversationHandle: message?.conversationHandle ?? '',
    conversationGroupId: message?.conversationGroupId ?? '',
    messageSequenceNumber: message?.sequence ?? '',
    messageTypeName: message?.type ?? '',
    body,
    attempts: job.attempts,
    lastError: job.lastError,
    deadAt: job.finishedAt,
    droppedBytes: message?.droppedBytes ?? null,
  };
}
