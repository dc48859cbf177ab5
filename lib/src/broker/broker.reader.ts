import type { Clock } from '../core/clock.js';
import { SqlQueueJobTimeoutError, SqlQueueShutdownError, SqlQueueUnrecoverableError } from '../core/errors.js';
import { safeEmit, type BrokerDeadReason, type QueueEventListener } from '../core/events.js';
import type { QueueLogger } from '../core/logger.js';
import { decodeBrokerBody, parseBrokerErrorBody } from './broker.body.js';
import { BROKER_SYSTEM } from './broker.names.js';
import {
  BROKER_DEAD_LETTER_ERROR_CODE,
  deadLetter,
  drainConversationToDead,
  endConversation,
  forgetMessage,
  journalAttempt,
  journalFailure,
  journalRelease,
  receiveFromGroup,
  rollbackMessage,
  saveMessage,
  waitForGroup,
  type BrokerJournalRow,
  type BrokerReceivedRow,
} from './broker.reader.queries.js';
import type {
  BrokerDriver,
  BrokerHandler,
  BrokerMessageContext,
  BrokerSession,
  ResolvedBrokerQueue,
} from './broker.types.js';

/**
 * Runs that never recorded an outcome (a crash, a lost connection: each a full rollback of the
 * reader's transaction) after which a message is dead-lettered without running again, whatever
 * maxAttempts says. Service Broker disables a queue at the fifth consecutive rollback of a
 * transaction that received from it; the fifth run is never started.
 */
export const BROKER_CRASH_CAP = 4;

/** What one runOnce() did. */
export type BrokerReaderOutcome =
  /** The WAITFOR came back without a conversation group (or the group had nothing left). */
  | 'empty'
  /** Messages were received and the transaction committed (handled, failed back, dead-lettered, or waited on a retry). */
  | 'handled'
  /** stop() was called: the transaction was committed and the reader takes no more work. */
  | 'stopped';

export interface BrokerReaderOptions {
  driver: BrokerDriver;
  /** The module schema: BrokerAttempts and BrokerDead live there. */
  schema: string;
  queue: ResolvedBrokerQueue;
  /** WAITFOR (GET CONVERSATION GROUP) timeout, ms (the resolved `broker.waitTimeoutMs`). */
  waitTimeoutMs: number;
  handler: BrokerHandler;
  clock: Clock;
  logger: QueueLogger;
  /** Recorded in the attempt journal. */
  workerId: string;
  listeners: readonly QueueEventListener[];
  /**
   * Longest wait, holding the group, for a message whose retry is not due yet, before the
   * transaction commits and the group is let go (default waitTimeoutMs).
   */
  maxRetryWaitMs?: number;
}

/** What happened to one received message; 'stop' ends the batch (the transaction commits). */
type Step = 'next' | 'again' | 'stop';

interface RunningHandler {
  controller: AbortController;
  /** Set when stop() aborted it: its rejection gives the run back instead of failing it. */
  abortedByStop: boolean;
  done: Promise<unknown>;
}

interface Transaction {
  session: BrokerSession;
  /** True between SAVE TRANSACTION and the end of that message's step: an error rolls back to the savepoint. */
  inSavepoint: boolean;
  /** Messages finished in this transaction (handled, dead-lettered or ended). */
  finished: number;
  /** The transaction already waited once for a retry that was not due. */
  waitedForRetry: boolean;
}

/**
 * One reader of a broker queue (Service Broker, SQL Server): framework-free, one connection at
 * a time, one transaction per runOnce(). The loop around it (BrokerQueueReaders) decides when
 * to run again, back off after an error, or retire.
 *
 * A transaction (research (i) Part B):
 * 1. `WAITFOR (GET CONVERSATION GROUP)` locks a conversation group (nothing: commit, 'empty').
 * 2. Up to messagesPerTransaction times: `SAVE TRANSACTION`, `RECEIVE TOP (1)` from that group.
 *    EndDialog, Error and our Close end our side of the conversation; DialogTimer is dropped;
 *    an application message is journaled (another connection, committed, before the handler
 *    runs, so a crash is counted) and handed to the handler.
 * 3. A handler error rolls back to the savepoint: the message returns to the queue, first in its
 *    conversation, and the group stays locked; the failure and its retry time are journaled, the
 *    batch stops, and the earlier successes commit. After maxAttempts runs, or
 *    BROKER_CRASH_CAP runs that never recorded an outcome, the message moves to the dead table
 *    and its conversation ends with an error (its queued messages kept as 'conversation-ended').
 * The transaction always commits; it is rolled back only when the server doomed it. So the
 * reader itself never counts towards Service Broker's five-rollback queue disable.
 */
export class BrokerReader {
  private readonly schema: string;
  private readonly queue: ResolvedBrokerQueue;
  private readonly maxRetryWaitMs: number;
  private stopRequested = false;
  /** Aborts the reader's own waits (a retry not due) at stop(). */
  private readonly stopSignal = new AbortController();
  private session: BrokerSession | null = null;
  /** True while the WAITFOR is in flight: the one statement stop() cancels. */
  private waiting = false;
  private handlerRun: RunningHandler | null = null;
  private current: Promise<BrokerReaderOutcome> | null = null;

  constructor(private readonly options: BrokerReaderOptions) {
    this.schema = options.schema;
    this.queue = options.queue;
    this.maxRetryWaitMs = options.maxRetryWaitMs ?? options.waitTimeoutMs;
  }

  /** True while a handler runs. */
  get busy(): boolean {
    return this.handlerRun !== null;
  }

  /**
   * One transaction (see the class comment). Rejects with the error when one of our own
   * statements failed (connection lost, deadlock…), after ending the transaction: the message
   * in hand back to the queue and earlier successes committed, or everything rolled back if the
   * server had doomed the transaction. The caller logs and backs off. After stop(): 'stopped'.
   */
  runOnce(): Promise<BrokerReaderOutcome> {
    if (this.stopRequested) return Promise.resolve('stopped');
    if (this.current)
      return Promise.reject(new Error(`broker reader of '${this.queue.name}': runOnce() is already running`));
    const run = this.run().finally(() => {
      this.current = null;
    });
    this.current = run;
    return run;
  }

  /**
   * Stops the reader: an idle WAITFOR is cancelled at once (the transaction, which received
   * nothing, commits); a running handler is awaited and its signal aborted after abortAfterMs
   * (its run is given back, not counted as a failure). Resolves when the current runOnce() has
   * ended; later runOnce() calls return 'stopped'.
   */
  async stop(options: { abortAfterMs?: number } = {}): Promise<void> {
    if (!this.stopRequested) {
      this.stopRequested = true;
      this.stopSignal.abort();
      if (this.waiting) this.session?.cancel();
    }
    const running = this.handlerRun;
    if (running && options.abortAfterMs !== undefined) {
      const settled = new AbortController();
      void running.done.finally(() => settled.abort());
      void this.options.clock.sleep(options.abortAfterMs, settled.signal).then(() => {
        if (this.handlerRun !== running || running.controller.signal.aborted) return;
        running.abortedByStop = true;
        running.controller.abort(new SqlQueueShutdownError());
      });
    }
    await this.current?.catch(() => undefined);
  }

  private async run(): Promise<BrokerReaderOutcome> {
    const session = await this.options.driver.beginReader();
    this.session = session;
    const tx: Transaction = { session, inSavepoint: false, finished: 0, waitedForRetry: false };
    try {
      return await this.transaction(tx);
    } catch (error) {
      await this.endAfterError(tx, error);
      throw error;
    } finally {
      this.session = null;
    }
  }

  private async transaction(tx: Transaction): Promise<BrokerReaderOutcome> {
    const { session } = tx;
    const group = await this.waitForGroup(session);
    if (group === 'stopped' || group === null || this.stopRequested) {
      // Nothing was received: committing ends the transaction (and any group lock) cleanly.
      await session.commit();
      return group === null && !this.stopRequested ? 'empty' : 'stopped';
    }
    let received = 0;
    for (let done = 0; done < this.queue.messagesPerTransaction && !this.stopRequested;) {
      await session.query(saveMessage());
      tx.inSavepoint = true;
      const [message] = await session.query<BrokerReceivedRow & Record<string, unknown>>(
        receiveFromGroup(this.queue.queue),
        {
          group: { type: 'uniqueidentifier', value: group },
        },
      );
      if (!message) {
        tx.inSavepoint = false;
        break;
      }
      received++;
      const step = await this.handleMessage(tx, message);
      tx.inSavepoint = false;
      if (step === 'stop') break;
      if (step === 'next') done++;
    }
    await session.commit();
    if (this.stopRequested) return 'stopped';
    return received === 0 ? 'empty' : 'handled';
  }

  /** The locked group's id, null after an empty wait, 'stopped' when stop() cancelled the wait. */
  private async waitForGroup(session: BrokerSession): Promise<string | null | 'stopped'> {
    if (this.stopRequested) return 'stopped';
    this.waiting = true;
    try {
      const [row] = await session.query<{ conversation_group_id: string | null }>(waitForGroup(this.queue.queue), {
        timeoutMs: { type: 'int', value: this.options.waitTimeoutMs },
      });
      return row?.conversation_group_id ?? null;
    } catch (error) {
      if (this.stopRequested && this.options.driver.isCancelled(error)) return 'stopped';
      throw error;
    } finally {
      this.waiting = false;
    }
  }

  private async handleMessage(tx: Transaction, message: BrokerReceivedRow): Promise<Step> {
    const type = message.message_type_name;
    const handle = { handle: { type: 'uniqueidentifier' as const, value: message.conversation_handle } };
    switch (type) {
      case BROKER_SYSTEM.DIALOG_TIMER:
        // We start no conversation timers; receiving it is all it takes to drop it.
        tx.finished++;
        return 'next';
      case BROKER_SYSTEM.ERROR:
      case BROKER_SYSTEM.END_DIALOG:
      case this.queue.closeMessageType:
        // Both sides must end a conversation. Error: the other side (or the broker) ended it
        // with an error. Close: the sender recycles this dialog; our end sends it EndDialog.
        if (type === BROKER_SYSTEM.ERROR) {
          this.options.logger.warn(
            `broker queue '${this.queue.name}': conversation ${message.conversation_handle} ended with an error from the other side (${describeBrokerError(message.message_body)}); ending our side`,
          );
        }
        await tx.session.query(endConversation(), handle);
        tx.finished++;
        return 'next';
      default:
        // The application's message type (and any other type the contract lets through: the
        // handler sees messageTypeName).
        return this.handleApplicationMessage(tx, message);
    }
  }

  private async handleApplicationMessage(tx: Transaction, message: BrokerReceivedRow): Promise<Step> {
    const { session } = tx;
    const sequence = String(message.message_sequence_number);
    const key = {
      handle: { type: 'uniqueidentifier' as const, value: message.conversation_handle },
      sequence: { type: 'bigint' as const, value: sequence },
    };
    const [journal] = await this.options.driver.query<BrokerJournalRow & Record<string, unknown>>(
      journalAttempt(this.schema),
      {
        queue: { type: 'nvarchar', value: this.queue.name },
        ...key,
        // BrokerAttempts.WorkerId is nvarchar(200).
        workerId: { type: 'nvarchar', value: this.options.workerId.slice(0, 200) },
      },
    );
    if (!journal) throw new Error(`broker queue '${this.queue.name}': the attempt journal returned no row`);
    const attempts = Number(journal.Attempts);
    const failures = Number(journal.Failures);

    if (!Number(journal.Journaled)) {
      // Received before its retry is due: give it back (the group stays locked, so nothing
      // behind it in its conversation can overtake it).
      await session.query(rollbackMessage());
      tx.inSavepoint = false;
      if (tx.finished > 0 || tx.waitedForRetry) return 'stop';
      const retryInMs = Math.max(0, Number(journal.RetryInMs));
      tx.waitedForRetry = true;
      await this.options.clock.sleep(Math.min(retryInMs, this.maxRetryWaitMs), this.stopSignal.signal);
      return this.stopRequested || retryInMs > this.maxRetryWaitMs ? 'stop' : 'again';
    }

    // Runs before this one that never recorded an outcome.
    const crashes = Math.max(0, attempts - 1 - failures);
    if (attempts > this.queue.maxAttempts || crashes >= BROKER_CRASH_CAP) {
      const reason: BrokerDeadReason = attempts > this.queue.maxAttempts ? 'max-attempts' : 'crashes';
      const lastError =
        reason === 'crashes'
          ? `${crashes} runs ended without an outcome (process crash or lost connection)${journal.LastError ? `; last handler error: ${journal.LastError}` : ''}`
          : journal.LastError;
      await this.deadLetter(tx, message, { attempts: attempts - 1, crashes, lastError, reason });
      return 'next';
    }

    // A run without an outcome was a full rollback, which also undid the recorded successes of
    // the messages handled before it in that transaction: each of them now counts one crash too.
    // So a message with a crash on record runs alone in its transaction, and the crashes pile up
    // on the message that causes them, not on its neighbours (which clear theirs on success).
    const suspect = crashes > 0;
    if (suspect && tx.finished > 0) {
      await session.query(rollbackMessage());
      tx.inSavepoint = false;
      await this.options.driver.query(journalRelease(this.schema), key);
      return 'stop';
    }

    const context: Omit<BrokerMessageContext, 'signal'> = {
      queue: this.queue.name,
      conversationHandle: message.conversation_handle,
      conversationGroupId: message.conversation_group_id,
      messageTypeName: message.message_type_name,
      messageSequenceNumber: sequence,
      attempt: attempts,
      maxAttempts: this.queue.maxAttempts,
    };
    const started = this.options.clock.now();
    const outcome = await this.runHandler(message, context);
    const durationMs = this.options.clock.now() - started;

    if (outcome.ok) {
      await session.query(forgetMessage(this.schema), key);
      tx.finished++;
      safeEmit(this.options.listeners, 'brokerHandled', { queue: this.queue.name, attempt: attempts, durationMs });
      // A suspect's success commits at once, alone (see above).
      return suspect ? 'stop' : 'next';
    }

    const errorText = describeError(outcome.error);
    if (outcome.abortedByStop) {
      // The application is stopping: the message goes back and this run does not count.
      await session.query(rollbackMessage());
      tx.inSavepoint = false;
      await this.options.driver.query(journalRelease(this.schema), key);
      return 'stop';
    }
    const unrecoverable = outcome.error instanceof SqlQueueUnrecoverableError;
    if (unrecoverable || attempts >= this.queue.maxAttempts) {
      // Still in hand under the savepoint: it goes to the dead table from here.
      safeEmit(this.options.listeners, 'brokerFailed', {
        queue: this.queue.name,
        attempt: attempts,
        dead: true,
        error: errorText,
      });
      await this.deadLetter(tx, message, { attempts, crashes, lastError: errorText, reason: 'max-attempts' });
      return 'next';
    }
    await session.query(rollbackMessage());
    tx.inSavepoint = false;
    const delayMs = this.queue.retryDelay(attempts, outcome.error);
    await this.options.driver.query(journalFailure(this.schema), {
      ...key,
      error: { type: 'nvarchar', value: errorText },
      delayMs: { type: 'int', value: Math.max(0, Math.min(Math.round(delayMs), 2_147_483_647)) },
    });
    safeEmit(this.options.listeners, 'brokerFailed', {
      queue: this.queue.name,
      attempt: attempts,
      dead: false,
      error: errorText,
    });
    // Stop the batch: the group's next message must not run before this one is retried.
    return 'stop';
  }

  /**
   * Runs the handler with a signal that aborts at maxDurationMs (the run then fails and the
   * handler is left to finish on its own, as the table queue does) or at stop({ abortAfterMs }).
   * A body that does not decode fails like an unrecoverable handler error: it never will.
   */
  private async runHandler(
    message: BrokerReceivedRow,
    context: Omit<BrokerMessageContext, 'signal'>,
  ): Promise<{ ok: true } | { ok: false; error: unknown; abortedByStop: boolean }> {
    let body: unknown;
    try {
      body = decodeBrokerBody(this.queue.format, message.message_body);
    } catch (error) {
      return {
        ok: false,
        error: new SqlQueueUnrecoverableError(
          `broker queue '${this.queue.name}': ${(error as Error).message} (format '${this.queue.format}')`,
          { cause: error },
        ),
        abortedByStop: false,
      };
    }
    const controller = new AbortController();
    const settled = new AbortController();
    const work = Promise.resolve().then(() => this.options.handler(body, { ...context, signal: controller.signal }));
    const running: RunningHandler = { controller, abortedByStop: false, done: work.catch(() => undefined) };
    this.handlerRun = running;
    const maxDurationMs = this.queue.maxDurationMs;
    const timedOut =
      maxDurationMs === null
        ? new Promise<never>(() => undefined)
        : this.options.clock.sleep(maxDurationMs, settled.signal).then(() => 'timeout' as const);
    try {
      const result = await Promise.race([work.then(() => 'done' as const), timedOut]);
      if (result === 'timeout' && !settled.signal.aborted) {
        const error = new SqlQueueJobTimeoutError(
          this.queue.name,
          `${context.conversationHandle}#${context.messageSequenceNumber}`,
          maxDurationMs!,
        );
        controller.abort(error);
        this.options.logger.warn(
          `broker queue '${this.queue.name}': ${error.message}; its signal was aborted and the run counts as failed (the handler is left to finish)`,
        );
        return { ok: false, error, abortedByStop: false };
      }
      return { ok: true };
    } catch (error) {
      return { ok: false, error, abortedByStop: running.abortedByStop };
    } finally {
      settled.abort();
      this.handlerRun = null;
    }
  }

  /**
   * The message in hand (received under the current savepoint) goes to the dead table, and its
   * conversation ends with an error after its queued messages are kept there too.
   */
  private async deadLetter(
    tx: Transaction,
    message: BrokerReceivedRow,
    dead: { attempts: number; crashes: number; lastError: string | null; reason: BrokerDeadReason },
  ): Promise<void> {
    const { session } = tx;
    const handle = { type: 'uniqueidentifier' as const, value: message.conversation_handle };
    const queueName = { type: 'nvarchar' as const, value: this.queue.name };
    await session.query(deadLetter(this.schema), {
      queue: queueName,
      handle,
      group: { type: 'uniqueidentifier', value: message.conversation_group_id },
      sequence: { type: 'bigint', value: String(message.message_sequence_number) },
      messageType: { type: 'nvarchar', value: message.message_type_name },
      body: { type: 'varbinary', value: message.message_body ?? null },
      attempts: { type: 'int', value: dead.attempts },
      crashes: { type: 'int', value: dead.crashes },
      lastError: { type: 'nvarchar', value: dead.lastError },
      reason: { type: 'nvarchar', value: dead.reason },
    });
    const [drained] = await session.query<{ Moved: number | string }>(
      drainConversationToDead(this.schema, this.queue.queue),
      {
        queue: queueName,
        handle,
        messageType: { type: 'nvarchar', value: this.queue.messageType },
        code: { type: 'int', value: BROKER_DEAD_LETTER_ERROR_CODE },
        description: { type: 'nvarchar', value: deadDescription(message, dead) },
      },
    );
    tx.finished++;
    this.options.logger.warn(
      `broker queue '${this.queue.name}': message ${message.message_sequence_number} of conversation ${message.conversation_handle} moved to the dead table (${dead.reason}, ${dead.attempts} runs${dead.lastError ? `, last error: ${dead.lastError}` : ''}); the conversation was ended with an error`,
    );
    safeEmit(this.options.listeners, 'brokerDeadLettered', { queue: this.queue.name, reason: dead.reason, count: 1 });
    const moved = Number(drained?.Moved ?? 0);
    if (moved > 0) {
      safeEmit(this.options.listeners, 'brokerDeadLettered', {
        queue: this.queue.name,
        reason: 'conversation-ended',
        count: moved,
      });
    }
  }

  /**
   * After one of our statements failed: the message in hand goes back (rollback to its
   * savepoint) and the rest commits. If the server doomed or ended the transaction, neither
   * works: roll back, which Service Broker counts towards its five-rollback queue disable.
   */
  private async endAfterError(tx: Transaction, error: unknown): Promise<void> {
    try {
      if (tx.inSavepoint) await tx.session.query(rollbackMessage());
      tx.inSavepoint = false;
      await tx.session.commit();
    } catch (endError) {
      try {
        await tx.session.rollback();
      } catch {
        // The connection may be gone; the server rolls back with it.
      }
      this.options.logger.error(
        `broker queue '${this.queue.name}': after ${describeError(error)}, the reader's transaction could not be committed (${describeError(endError)}); it was rolled back (a full rollback counts towards Service Broker's five-rollback queue disable)`,
      );
    }
  }
}

function describeError(error: unknown): string {
  if (error instanceof Error) return error.message || error.name;
  return String(error);
}

/** The Code and Description of a Service Broker Error message body (XML), for the log. */
export function describeBrokerError(body: Buffer | null): string {
  const { code, description } = parseBrokerErrorBody(body);
  return code === null ? description.slice(0, 500) : `code ${code}: ${description}`.trim();
}

/** END CONVERSATION … DESCRIPTION: at most 3000 characters (nvarchar(3000)). */
function deadDescription(
  message: BrokerReceivedRow,
  dead: { attempts: number; lastError: string | null; reason: BrokerDeadReason },
): string {
  const text = `nestjs-sql-queue: message ${message.message_sequence_number} was moved to the dead table (${dead.reason} after ${dead.attempts} runs)${dead.lastError ? `: ${dead.lastError}` : ''}; the conversation's queued messages were kept there`;
  return text.length > 3000 ? `${text.slice(0, 2997)}...` : text;
}
