import { silentLogger, type QueueLogger } from '../../core/logger.js';
import { parseBrokerErrorBody } from '../broker.body.js';
import { BROKER_SYSTEM } from '../broker.names.js';
import { giveBackInitiatorMessages, receiveInitiator, settleEndedDialog } from './broker.sender.queries.js';
import { commitOrRollback } from '../driver/index.js';
import type { BrokerDriver, BrokerSession, ResolvedBrokerQueue } from '../broker.types.js';

export interface BrokerInitiatorReaderOptions {
  driver: BrokerDriver;
  /** The module schema (BrokerDialogs, BrokerOutbox). */
  schema: string;
  queue: ResolvedBrokerQueue;
  /** WAITFOR timeout of an idle wait (the module's broker.waitTimeoutMs). */
  waitTimeoutMs: number;
  logger?: QueueLogger;
  /** Messages received per transaction (default 50). */
  messagesPerReceive?: number;
}

/** What one pass did: nothing arrived in the wait, messages were handled, or the reader was stopped. */
export type BrokerInitiatorOutcome = 'empty' | 'handled' | 'stopped';

interface InitiatorMessage {
  conversation_handle: string;
  message_type_name: string;
  message_body: Buffer | null;
}

/**
 * Reads a broker queue's initiator queue, where the target's EndDialog and Error messages for our
 * dialogs arrive, and ends our side of each such dialog: no fire-and-forget, no endpoint left in
 * DISCONNECTED_INBOUND. When the ended dialog was closing (the recycle handshake), the sends that
 * waited in the outbox go out, in order, on a new dialog in the same transaction. An Error is
 * logged with its code and description; the key's next send opens a new dialog.
 *
 * One instance per broker queue per process that sends to it. It owns no timer: whoever drives it
 * (the Nest layer, the reader pool) calls runOnce() in a loop and backs off when it rejects.
 */
export class BrokerInitiatorReader {
  private readonly logger: QueueLogger;
  private readonly top: number;
  private stopping = false;
  private waiting: BrokerSession | null = null;
  private running: Promise<BrokerInitiatorOutcome> | null = null;

  constructor(private readonly options: BrokerInitiatorReaderOptions) {
    this.logger = options.logger ?? silentLogger;
    this.top = options.messagesPerReceive ?? 50;
  }

  /**
   * One transaction: wait up to waitTimeoutMs for messages, end our side of the dialogs they end,
   * commit. Rejects when a statement of ours fails, after returning the received messages to the
   * queue (rollback to a savepoint, then commit: a full rollback counts toward the queue's poison
   * limit of five).
   */
  runOnce(): Promise<BrokerInitiatorOutcome> {
    const run = this.receiveOnce().finally(() => {
      if (this.running === run) this.running = null;
    });
    this.running = run;
    return run;
  }

  /** Cancels an idle wait (its transaction commits: nothing was received) and waits for the pass in progress. */
  async stop(): Promise<void> {
    this.stopping = true;
    this.waiting?.cancel();
    await this.running?.catch(() => undefined);
  }

  private async receiveOnce(): Promise<BrokerInitiatorOutcome> {
    if (this.stopping) return 'stopped';
    const { driver, queue } = this.options;
    const session = await driver.beginReader();
    let rows: InitiatorMessage[];
    try {
      if (this.stopping) rows = [];
      else {
        this.waiting = session;
        rows = await session.query<InitiatorMessage & Record<string, unknown>>(
          receiveInitiator(queue, this.top, this.options.waitTimeoutMs),
        );
      }
    } catch (error) {
      // Nothing was received: committing ends the transaction without a rollback to count.
      await commitOrRollback(session);
      if (driver.isCancelled(error)) return 'stopped';
      throw error;
    } finally {
      this.waiting = null;
    }
    if (rows.length === 0) {
      await session.commit();
      return this.stopping ? 'stopped' : 'empty';
    }
    try {
      for (const [handle, messages] of byConversation(rows)) await this.settle(session, handle, messages);
      await session.commit();
      return 'handled';
    } catch (error) {
      await this.giveBack(session);
      throw error;
    }
  }

  private async settle(session: BrokerSession, handle: string, messages: InitiatorMessage[]): Promise<void> {
    const name = this.options.queue.name;
    let ended = false;
    for (const message of messages) {
      if (message.message_type_name === BROKER_SYSTEM.END_DIALOG) ended = true;
      else if (message.message_type_name === BROKER_SYSTEM.ERROR) {
        ended = true;
        const { code, description } = parseBrokerErrorBody(message.message_body);
        this.logger.warn(
          `broker queue '${name}': the target ended dialog ${handle} with error ${code ?? '(no code)'}: ${description}`,
        );
      } else {
        this.logger.warn(
          `broker queue '${name}': unexpected message type '${message.message_type_name}' on the initiator queue (dialog ${handle}); dropped`,
        );
      }
    }
    if (!ended) return;
    const [result] = await session.query<{
      DialogKey: string | null;
      State: string | null;
      NewHandle: string | null;
      Flushed: number | string;
    }>(settleEndedDialog(this.options.schema, this.options.queue), {
      queue: { type: 'nvarchar', value: name },
      handle: { type: 'uniqueidentifier', value: handle },
    });
    if (result?.NewHandle) {
      this.logger.log(
        `broker queue '${name}': dialog ${handle} of key '${result.DialogKey}' ended; ${result.Flushed} waiting message(s) sent on new dialog ${result.NewHandle}`,
      );
    }
  }

  /** Back to the savepoint before RECEIVE (the messages return to the queue), then commit. */
  private async giveBack(session: BrokerSession): Promise<void> {
    try {
      await session.query(giveBackInitiatorMessages());
      await session.commit();
    } catch {
      // The server doomed the transaction: only a full rollback can end it.
      await session.rollback().catch(() => undefined);
    }
  }
}

/** Received messages by conversation, in arrival order. */
function byConversation(rows: InitiatorMessage[]): Map<string, InitiatorMessage[]> {
  const groups = new Map<string, InitiatorMessage[]>();
  for (const row of rows) {
    const handle = String(row.conversation_handle);
    const group = groups.get(handle);
    if (group) group.push(row);
    else groups.set(handle, [row]);
  }
  return groups;
}
