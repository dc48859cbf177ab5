import { SqlQueueError, SqlQueueValidationError } from '../../core/errors.js';
import { silentLogger, type QueueLogger } from '../../core/logger.js';
import { assertKeyText, assertOptionGroup } from '../../core/validation.js';
import { encodeBrokerBody } from '../broker.body.js';
import {
  closeDialog,
  enqueueOutbox,
  forgetDialog,
  lockDialog,
  openDialog,
  sendOnDialog,
} from './broker.sender.queries.js';
import type { BrokerDriver, BrokerParams, BrokerSession, ResolvedBrokerQueue } from '../broker.types.js';

/** Options of one send. */
export interface BrokerSendOptions {
  /**
   * Messages with the same key travel on one long-lived dialog, so the target handles them one at
   * a time in send order. Without a key, sends spread over `unkeyedDialogs` shared dialogs, with no
   * order promised. 1 to 255 characters.
   */
  groupKey?: string | null;
  /** An open mssql Transaction of the caller: the send commits or rolls back with it. */
  transaction?: unknown;
}

/** What a send did. */
export interface BrokerSendResult {
  /**
   * The dialog the message went on; null when it waits in the outbox because its key's dialog is
   * being recycled (it goes out, in order, on the key's next dialog once the old one has ended).
   */
  conversationHandle: string | null;
}

export interface BrokerSenderOptions {
  driver: BrokerDriver;
  /** The module schema (BrokerDialogs, BrokerOutbox). */
  schema: string;
  /** Largest encoded body (the module's maxPayloadBytes). */
  maxPayloadBytes: number;
  /** Dialogs shared by sends without a group key. */
  unkeyedDialogs: number;
  /** Age after which a key's dialog is recycled through the close handshake; null: never. */
  dialogRecycleMs: number | null;
  logger?: QueueLogger;
  /** [0, 1) source for picking an unkeyed dialog (tests pass a fixed one). */
  random?: () => number;
}

/** Dialog key prefix of unkeyed sends ('~unkeyed~0' …); group keys are sent as they are. */
export const UNKEYED_DIALOG_PREFIX = '~unkeyed~';

const SEND_OPTIONS = ['groupKey', 'transaction'];

/** XACT_STATE() of a transaction that can still commit. */
const COMMITTABLE = 1;

interface DialogRow {
  ConversationHandle: string;
  State: 'A' | 'C';
  AgeMs: string | number;
}

interface SendOutcome {
  ErrorNumber: number;
  XactState: number;
}

/**
 * Sends to broker queues with no fire-and-forget and no endpoint leak: each group key keeps one
 * long-lived dialog (BrokerDialogs) that is reused for every send, so the target receives the
 * key's messages in order on one conversation; a dialog is retired only through the close
 * handshake (our Close message → the target ends the conversation after the messages before it →
 * the initiator reader ends our side and sends the outbox on a new dialog).
 *
 * One send is one transaction (the caller's when given): the key's application lock and its row
 * (UPDLOCK) are taken first, which serializes sends of a key and leaves sends of other keys free
 * (no key-range lock: see lockDialog); then the dialog is begun, used, closed, or the message goes
 * to the outbox while the key's dialog is closing. A dialog the target ended
 * (SEND fails with 8429/8426) is ended on our side and replaced by a new one in the same
 * transaction, so the message is still sent.
 */
export class BrokerSender {
  private readonly driver: BrokerDriver;
  private readonly schema: string;
  private readonly logger: QueueLogger;
  private readonly random: () => number;

  constructor(private readonly options: BrokerSenderOptions) {
    this.driver = options.driver;
    this.schema = options.schema;
    this.logger = options.logger ?? silentLogger;
    this.random = options.random ?? Math.random;
  }

  /**
   * Sends `body` (encoded per the queue's format) to `queue`'s target service. Validation
   * (options, group key, body encoding and size) throws SqlQueueValidationError before any SQL.
   * With `transaction`, nothing is committed or rolled back here: the message is sent if and when
   * the caller commits.
   */
  async send(queue: ResolvedBrokerQueue, body: unknown, options: BrokerSendOptions = {}): Promise<BrokerSendResult> {
    const where = `send to broker queue '${queue.name}'`;
    const opts = assertOptionGroup(where, options, SEND_OPTIONS, SqlQueueValidationError);
    const groupKey =
      opts.groupKey === undefined || opts.groupKey === null ? null : assertKeyText(where, 'groupKey', opts.groupKey);
    const bytes = encodeBrokerBody(queue.format, body, this.options.maxPayloadBytes, where);
    const dialogKey = groupKey ?? this.unkeyedDialogKey();

    // The caller's transaction is the caller's to end (its session's commit and rollback are
    // no-ops anyway; not calling them keeps that visible here).
    const owned = opts.transaction === undefined;
    const session = await this.driver.begin(opts.transaction);
    try {
      const result = await this.sendIn(session, queue, dialogKey, bytes);
      if (owned) await session.commit();
      return result;
    } catch (error) {
      if (owned) await session.rollback().catch(() => undefined);
      throw error;
    }
  }

  /**
   * Sends `body` on `dialogKey`'s dialog inside an open session. With `body` null it only closes
   * the key's active dialog (the dead-message retry's dialog after its last batch).
   * @internal
   */
  async sendIn(
    session: BrokerSession,
    queue: ResolvedBrokerQueue,
    dialogKey: string,
    body: Buffer | null,
  ): Promise<BrokerSendResult> {
    const key = this.keyParams(queue, dialogKey);
    const [row] = await session.query<DialogRow & Record<string, unknown>>(lockDialog(this.schema), key);
    const withBody: BrokerParams = { ...key, body: { type: 'varbinary', value: body } };
    if (!row) return body === null ? { conversationHandle: null } : this.open(session, queue, withBody);
    if (row.State === 'C') {
      if (body !== null) await session.query(enqueueOutbox(this.schema), { ...withBody, ...this.messageType(queue) });
      return { conversationHandle: null };
    }

    const handle = String(row.ConversationHandle);
    const recycle =
      body === null || (this.options.dialogRecycleMs !== null && Number(row.AgeMs) >= this.options.dialogRecycleMs);
    const params: BrokerParams = { ...withBody, handle: { type: 'uniqueidentifier', value: handle } };
    const [outcome] = recycle
      ? await session.query<SendOutcome & Record<string, unknown>>(closeDialog(this.schema, queue), {
          ...params,
          ...this.messageType(queue),
        })
      : await session.query<SendOutcome & Record<string, unknown>>(sendOnDialog(this.schema, queue), params);
    const error = Number(outcome?.ErrorNumber ?? 0);
    if (error === 0) {
      if (recycle && body !== null) {
        this.logger.log(
          `broker queue '${queue.name}': dialog ${handle} of key '${dialogKey}' is ${row.AgeMs} ms old: closing it; sends of the key wait in the outbox until the target has ended it`,
        );
      }
      return { conversationHandle: recycle ? null : handle };
    }

    // The target ended the dialog (an error after a dead message, or an end we have not read yet).
    this.assertUsable(outcome?.XactState, queue, dialogKey, handle, error);
    this.logger.warn(
      `broker queue '${queue.name}': dialog ${handle} of key '${dialogKey}' was ended by the target (SEND error ${error}); ending our side${body === null ? '' : ' and sending on a new dialog'}`,
    );
    const [forgot] = await session.query<{ XactState: number }>(forgetDialog(this.schema), params);
    this.assertUsable(forgot?.XactState, queue, dialogKey, handle, error);
    return body === null ? { conversationHandle: null } : this.open(session, queue, withBody);
  }

  private keyParams(queue: ResolvedBrokerQueue, dialogKey: string): BrokerParams {
    return {
      queue: { type: 'nvarchar', value: queue.name },
      dialogKey: { type: 'nvarchar', value: dialogKey },
    };
  }

  private async open(
    session: BrokerSession,
    queue: ResolvedBrokerQueue,
    params: BrokerParams,
  ): Promise<BrokerSendResult> {
    const [opened] = await session.query<{ ConversationHandle: string }>(openDialog(this.schema, queue), params);
    if (!opened) throw new SqlQueueError(`broker queue '${queue.name}': BEGIN DIALOG returned no handle`);
    return { conversationHandle: String(opened.ConversationHandle) };
  }

  private messageType(queue: ResolvedBrokerQueue): BrokerParams {
    return { messageType: { type: 'nvarchar', value: queue.messageType } };
  }

  /** One of the unkeyed dialogs' keys, at random (the doorbell's rings use them too). @internal */
  unkeyedDialogKey(): string {
    const n = Math.min(this.options.unkeyedDialogs - 1, Math.floor(this.random() * this.options.unkeyedDialogs));
    return `${UNKEYED_DIALOG_PREFIX}${Math.max(0, n)}`;
  }

  private assertUsable(
    xactState: unknown,
    queue: ResolvedBrokerQueue,
    dialogKey: string,
    handle: string,
    error: number,
  ): void {
    if (Number(xactState) === COMMITTABLE) return;
    throw new SqlQueueError(
      `broker queue '${queue.name}': dialog ${handle} of key '${dialogKey}' was ended by the target (SEND error ${error}) and the server doomed the transaction, so nothing was sent: roll back and send again (the initiator reader ends the old dialog; with a transaction of your own, keep XACT_ABORT off)`,
    );
  }
}
