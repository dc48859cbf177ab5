import { safeEmit, type QueueEventListener } from '../../core/events.js';
import type { QueueLogger } from '../../core/logger.js';
import { parseBrokerErrorBody } from '../broker.body.js';
import { moveMessages, waitForMessages } from './broker.receiver.queries.js';
import type { BrokerConnection, BrokerDriver, BrokerReaderLoop, ResolvedBrokerQueue } from '../broker.types.js';

export interface BrokerReceiverOptions {
  driver: BrokerDriver;
  /** The module schema: the table queue's tables live there. */
  schema: string;
  queue: ResolvedBrokerQueue;
  /** WAITFOR (GET CONVERSATION GROUP) timeout, ms (the resolved `broker.waitTimeoutMs`). */
  waitTimeoutMs: number;
  /** maxAttempts of the moved jobs when the queue's consumers recorded none (the handler's resolved value). */
  maxAttempts: number;
  /** The most bytes of a body the move keeps (the module's maxPayloadBytes). */
  maxBodyBytes: number;
  logger: QueueLogger;
  listeners: readonly QueueEventListener[];
  /** Messages became jobs: this process's handlers of the queue should claim now. */
  onMoved(): void;
}

interface MoveRow {
  Received: number | string;
  Moved: number | string;
  Ended: number | string;
  Errors: string | null;
}

/**
 * One receiver of a broker queue (Service Broker, SQL Server): it moves messages into the
 * table queue of the same name and never runs a handler. Framework-free; the loop around it
 * (BrokerQueueReaders) runs it again, backs off after an error, or retires it.
 *
 * Each runOnce() waits for a conversation group with messages (autocommit: nothing is held
 * while it waits), then moves (moveMessages: one batch that receives, enqueues and commits on
 * the server), and while a move found messages the next runOnce() moves again without waiting.
 * The receiver owns its connection: after any failure it is closed and a new one opened, so a
 * batch the client gave up on (a request timeout: its outcome unknown, its transaction maybe
 * still open) never shares a connection with the next.
 */
export class BrokerReceiver implements BrokerReaderLoop {
  private readonly waitText: string;
  private readonly moveText: string;
  private connection: BrokerConnection | null = null;
  private stopping = false;
  private waiting = false;
  private moving = false;
  /** The last move found messages: move again before waiting. */
  private draining = false;
  private current: Promise<'empty' | 'handled' | 'stopped'> | null = null;

  constructor(private readonly options: BrokerReceiverOptions) {
    this.waitText = waitForMessages(options.queue.queue);
    this.moveText = moveMessages(options.schema, options.queue, options.maxBodyBytes);
  }

  /** True while a move runs (a receiver waiting in GET CONVERSATION GROUP is idle). */
  get busy(): boolean {
    return this.moving;
  }

  /**
   * One wait and move: 'handled' when messages were received, 'empty' when the wait timed out
   * or the move found nothing (another receiver took them), 'stopped' after stop(). Rejects when
   * a statement failed; the move's own failures leave its messages in the queue.
   */
  runOnce(): Promise<'empty' | 'handled' | 'stopped'> {
    if (this.stopping) return Promise.resolve('stopped');
    if (this.current) {
      return Promise.reject(
        new Error(`receiver of broker queue '${this.options.queue.name}': runOnce() is already running`),
      );
    }
    const run = this.round().finally(() => {
      this.current = null;
    });
    this.current = run;
    return run;
  }

  /** Cancels an idle wait at once, lets a move in flight finish, and closes the connection. */
  async stop(): Promise<void> {
    this.stopping = true;
    if (this.waiting) this.connection?.cancel();
    await this.current?.catch(() => undefined);
    await this.closeConnection();
  }

  private async round(): Promise<'empty' | 'handled' | 'stopped'> {
    const { driver, queue } = this.options;
    try {
      this.connection ??= await driver.openConnection();
      const connection = this.connection;
      if (!this.draining) {
        // Checked and sent in the same turn as stop() checks `waiting`: a stop either sees the
        // wait in flight and cancels it, or this sees the stop and sends nothing.
        if (this.stopping) return 'stopped';
        this.waiting = true;
        let ready: boolean;
        try {
          const [row] = await connection.query<{ Ready: number | boolean }>(this.waitText, {
            timeoutMs: { type: 'int', value: this.options.waitTimeoutMs },
          });
          ready = row?.Ready === true || Number(row?.Ready) === 1;
        } catch (error) {
          if (this.stopping && driver.isCancelled(error)) return 'stopped';
          throw error;
        } finally {
          this.waiting = false;
        }
        if (this.stopping) return 'stopped';
        if (!ready) return 'empty';
      }
      this.moving = true;
      let row: MoveRow | undefined;
      try {
        [row] = await connection.query<MoveRow & Record<string, unknown>>(this.moveText, {
          queue: { type: 'nvarchar', value: queue.name },
          maxAttempts: { type: 'int', value: this.options.maxAttempts },
        });
      } finally {
        this.moving = false;
      }
      const received = Number(row?.Received ?? 0);
      const moved = Number(row?.Moved ?? 0);
      const ended = Number(row?.Ended ?? 0);
      this.draining = received > 0;
      if (moved > 0) this.options.onMoved();
      if (received > 0) safeEmit(this.options.listeners, 'brokerMoved', { queue: queue.name, received, moved, ended });
      this.logErrors(row?.Errors ?? null);
      if (this.stopping) return 'stopped';
      return received > 0 ? 'handled' : 'empty';
    } catch (error) {
      this.draining = false;
      await this.closeConnection();
      throw error;
    }
  }

  /** Error messages that ended conversations in the move, with their code and description. */
  private logErrors(json: string | null): void {
    if (!json) return;
    let errors: { conversationHandle?: string; body?: string }[];
    try {
      errors = JSON.parse(json) as typeof errors;
    } catch {
      return;
    }
    for (const error of errors) {
      const { code, description } = parseBrokerErrorBody(error.body ? Buffer.from(error.body, 'base64') : null);
      this.options.logger.warn(
        `broker queue '${this.options.queue.name}': conversation ${error.conversationHandle} ended with an error from the other side (${code === null ? description.slice(0, 500) : `code ${code}: ${description}`}); ended our side`,
      );
    }
  }

  private async closeConnection(): Promise<void> {
    const connection = this.connection;
    this.connection = null;
    await connection?.close().catch(() => undefined);
  }
}
