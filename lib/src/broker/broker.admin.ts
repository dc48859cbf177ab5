import { randomUUID } from 'node:crypto';
import type { BrokerDeadReason } from '../core/events.js';
import { SqlQueueValidationError } from '../core/errors.js';
import { assertJobId } from '../core/producer.js';
import { MAX_AGE_MS, assertInteger, describe } from '../core/validation.js';
import {
  PURGE_BATCH,
  RETRY_BATCH,
  brokerQueueFigures,
  conversationEndpointsByState,
  idParams,
  lastDeadId,
  listDeadMessages,
  purgeDeadMessages,
  sendDeadMessages,
} from './broker.admin.queries.js';
import { decodeBrokerBodyOrBytes } from './broker.body.js';
import { quoteBrokerObject } from './broker.names.js';
import type { BrokerSender } from './broker.sender.js';
import type {
  BrokerDeadMessage,
  BrokerDeadMessagePage,
  BrokerDriver,
  BrokerParams,
  BrokerQueueStats,
  ResolvedBrokerQueue,
} from './broker.types.js';

export interface BrokerAdminOptions {
  driver: BrokerDriver;
  /** The module schema (BrokerDead, BrokerDialogs). */
  schema: string;
  /** The sender whose dialogs retried messages travel on. */
  sender: BrokerSender;
}

/** Dialog key prefix of a dead-message retry: each retry call gets a dialog of its own. */
export const RETRY_DIALOG_PREFIX = '~retry~';

interface DeadRow {
  Id: string | number;
  Queue: string;
  ConversationHandle: string;
  ConversationGroupId: string;
  MessageSequenceNumber: string | number;
  MessageTypeName: string;
  MessageBody: Buffer | null;
  Attempts: number;
  Crashes: number;
  LastError: string | null;
  Reason: BrokerDeadReason;
  DeadAt: Date;
}

/** Dead messages of broker queues (list, retry, purge) and the figures of a broker queue. */
export class BrokerAdmin {
  private readonly driver: BrokerDriver;
  private readonly schema: string;

  constructor(private readonly options: BrokerAdminOptions) {
    this.driver = options.driver;
    this.schema = options.schema;
  }

  /**
   * A page of `queue`'s dead messages in Id order: `limit` 1 to 1,000 (default 50), after `afterId`.
   * Bodies are decoded per the queue's format; one that does not decode is returned as its Buffer.
   */
  async listDeadMessages(
    queue: ResolvedBrokerQueue,
    page: { limit?: number; afterId?: string | null } = {},
  ): Promise<BrokerDeadMessagePage> {
    const limit = assertInteger('listDead limit', page.limit ?? 50, 1, 1000, SqlQueueValidationError);
    const afterId = page.afterId === undefined || page.afterId === null ? '0' : assertJobId(page.afterId);
    const rows = await this.driver.query<DeadRow & Record<string, unknown>>(listDeadMessages(this.schema), {
      ...this.queueParam(queue),
      afterId: { type: 'bigint', value: afterId },
      limit: { type: 'int', value: limit },
    });
    const messages = rows.map((row) => toDeadMessage(queue, row));
    return { messages, nextAfterId: messages.length === limit ? messages[messages.length - 1]!.id : null };
  }

  /**
   * Sends dead messages again, in Id order, on ONE new dialog of their own, deleting each dead row
   * in the transaction that sends it (batches of at most 1,000); returns the ids sent. The
   * original group key is not known on the target side (a dialog is all the target sees), so the
   * retried messages form their own ordered dialog: they run in their old order relative to each
   * other, but not in order with messages sent since under their old keys. After the last batch
   * the dialog is closed through the close handshake. `'all'` retries the queue's dead messages
   * up to the highest id present when the call starts.
   */
  async retryDeadMessages(queue: ResolvedBrokerQueue, ids: readonly string[] | 'all'): Promise<string[]> {
    const batches = ids === 'all' ? null : chunks(sortedIds(ids), RETRY_BATCH);
    if (batches !== null && batches.length === 0) return [];
    let lastId = '0';
    if (batches === null) {
      const [row] = await this.driver.query<{ LastId: string | number | null }>(
        lastDeadId(this.schema),
        this.queueParam(queue),
      );
      if (row?.LastId === null || row?.LastId === undefined) return [];
      lastId = String(row.LastId);
    }
    const dialogKey = `${RETRY_DIALOG_PREFIX}${randomUUID()}`;
    const retried: string[] = [];
    let dialogBegun = false;
    try {
      for (let i = 0, afterId = '0'; ; i++) {
        const batch = batches === null ? null : batches[i];
        if (batch === undefined) break;
        const sent = await this.sendBatch(queue, dialogKey, batch, afterId, lastId);
        dialogBegun = true;
        retried.push(...sent);
        if (batch === null) {
          if (sent.length < RETRY_BATCH) break;
          afterId = sent[sent.length - 1]!;
        }
      }
    } finally {
      // The retry's dialog is closed through the handshake, also after a later batch failed:
      // a dialog nobody ends would stay open on both sides for good.
      if (dialogBegun) await this.closeRetryDialog(queue, dialogKey);
    }
    return retried;
  }

  /**
   * Deletes `queue`'s dead messages that died at least `olderThanMs` ago (default: all), in
   * statements of at most 4,000 rows (no lock escalation); returns how many.
   */
  async purgeDeadMessages(queue: ResolvedBrokerQueue, options: { olderThanMs?: number } = {}): Promise<number> {
    const olderThanMs =
      options.olderThanMs === undefined
        ? 0
        : assertInteger('purgeDead olderThanMs', options.olderThanMs, 0, MAX_AGE_MS, SqlQueueValidationError);
    let total = 0;
    for (;;) {
      const [row] = await this.driver.query<{ Deleted: number }>(purgeDeadMessages(this.schema), {
        ...this.queueParam(queue),
        olderThanMs: { type: 'bigint', value: olderThanMs },
      });
      const deleted = Number(row?.Deleted ?? 0);
      total += deleted;
      if (deleted < PURGE_BATCH) return total;
    }
  }

  /** Messages waiting in the queue (from metadata, never a scan) and dead messages. */
  async brokerQueueFigures(queue: ResolvedBrokerQueue): Promise<BrokerQueueStats> {
    const [row] = await this.driver.query<{ MessagesWaiting: number | string | null; Dead: number | string }>(
      brokerQueueFigures(this.schema),
      { ...this.queueParam(queue), queueObject: { type: 'nvarchar', value: quoteBrokerObject(queue.queue) } },
    );
    return { messagesWaiting: Number(row?.MessagesWaiting ?? 0), dead: Number(row?.Dead ?? 0) };
  }

  /** This database's conversation endpoints by state_desc (CONVERSING, DISCONNECTED_INBOUND, CLOSED, …). */
  async conversationEndpointsByState(): Promise<Record<string, number>> {
    const rows = await this.driver.query<{ State: string; Count: number | string }>(conversationEndpointsByState());
    return Object.fromEntries(rows.map((row) => [String(row.State), Number(row.Count)]));
  }

  /** One transaction: the retry dialog (begun by the first batch), then the batch moved and sent. */
  private async sendBatch(
    queue: ResolvedBrokerQueue,
    dialogKey: string,
    ids: string[] | null,
    afterId: string,
    lastId: string,
  ): Promise<string[]> {
    const session = await this.driver.begin();
    try {
      const handle = await this.options.sender.ensureDialog(session, queue, dialogKey);
      const params: BrokerParams = {
        ...this.queueParam(queue),
        dialogKey: { type: 'nvarchar', value: dialogKey },
        handle: { type: 'uniqueidentifier', value: handle },
      };
      if (ids === null) {
        params.afterId = { type: 'bigint', value: afterId };
        params.lastId = { type: 'bigint', value: lastId };
        params.batch = { type: 'int', value: RETRY_BATCH };
      } else {
        idParams(ids.length).forEach((name, i) => (params[name.slice(1)] = { type: 'bigint', value: ids[i] }));
      }
      const text = sendDeadMessages(this.schema, queue, ids === null ? 'range' : { ids: ids.length });
      const rows = await session.query<{ Id: string | number }>(text, params);
      await session.commit();
      return rows.map((row) => String(row.Id));
    } catch (error) {
      await session.rollback().catch(() => undefined);
      throw error;
    }
  }

  private async closeRetryDialog(queue: ResolvedBrokerQueue, dialogKey: string): Promise<void> {
    const session = await this.driver.begin();
    try {
      await this.options.sender.sendIn(session, queue, dialogKey, null);
      await session.commit();
    } catch (error) {
      await session.rollback().catch(() => undefined);
      throw error;
    }
  }

  private queueParam(queue: ResolvedBrokerQueue): BrokerParams {
    return { queue: { type: 'nvarchar', value: queue.name } };
  }
}

function toDeadMessage(queue: ResolvedBrokerQueue, row: DeadRow): BrokerDeadMessage {
  return {
    id: String(row.Id),
    queue: row.Queue,
    conversationHandle: String(row.ConversationHandle),
    conversationGroupId: String(row.ConversationGroupId),
    messageSequenceNumber: String(row.MessageSequenceNumber),
    messageTypeName: row.MessageTypeName,
    body: decodeBrokerBodyOrBytes(queue.format, row.MessageBody),
    attempts: Number(row.Attempts),
    crashes: Number(row.Crashes),
    lastError: row.LastError ?? null,
    reason: row.Reason,
    deadAt: row.DeadAt,
  };
}

/** Valid, distinct ids in ascending numeric order. */
function sortedIds(ids: unknown): string[] {
  if (!Array.isArray(ids)) {
    throw new SqlQueueValidationError(
      `dead message ids must be an array of decimal strings or 'all', got ${describe(ids)}`,
    );
  }
  const unique = [...new Set(ids.map(assertJobId))];
  return unique.sort((a, b) => (BigInt(a) < BigInt(b) ? -1 : BigInt(a) > BigInt(b) ? 1 : 0));
}

function chunks<T>(items: T[], size: number): T[][] {
  const out: T[][] = [];
  for (let i = 0; i < items.length; i += size) out.push(items.slice(i, i + size));
  return out;
}
