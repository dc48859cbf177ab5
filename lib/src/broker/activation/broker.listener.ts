import { PollBackoff } from '../../core/backoff.js';
import { commitOrRollback } from '../driver/index.js';
import type { Clock } from '../../core/clock.js';
import { safeEmit, type QueueEventListener } from '../../core/events.js';
import { ThrottledErrorLog, type QueueLogger } from '../../core/logger.js';
import { settleWithin, withTimeout } from '../../core/timeout.js';
import { endBrokenNotificationDialog, pollBrokerQueue, receiveNotifications } from './broker.listener.queries.js';
import { BROKER_EVENT, BROKER_SYSTEM, brokerObjectText, quoteBrokerObject } from '../broker.names.js';
import type {
  BrokerActivationSource,
  BrokerDriver,
  BrokerRow,
  BrokerSession,
  ResolvedBrokerOptions,
  ResolvedBrokerQueue,
} from '../broker.types.js';

export interface BrokerListenerDeps {
  driver: BrokerDriver;
  options: ResolvedBrokerOptions;
  clock: Clock;
  logger: QueueLogger;
  listeners: readonly QueueEventListener[];
  random?: () => number;
  /** The broker queues this process consumes: the ones notifications and the poll route to. */
  queues: readonly ResolvedBrokerQueue[];
  /** A reader would have work on this queue: start one if the pool allows. */
  activate(queueName: string, source: BrokerActivationSource): void;
  /** Readers running on this queue in this process now. */
  readersOf(queueName: string): number;
  /**
   * Creates the queue's missing event notifications (setup 'auto' only). Default: runs the
   * setup's event notification batch on the shared pool.
   */
  recreateNotifications: (queue: ResolvedBrokerQueue) => Promise<void>;
}

/** What the listener saw of one queue. */
export interface BrokerListenerQueueState {
  /** A BROKER_QUEUE_DISABLED event arrived, or the poll read is_receive_enabled = 0, and no later poll saw it enabled. */
  disabledSeen: boolean;
  /** An event notification of the queue is missing and not recreated yet. */
  notificationProblem: string | null;
}

export interface BrokerListenerSnapshot {
  running: boolean;
  /** Engine clock of the receive loop's last completed round (a wait that returned, or start). */
  lastLoopAt: number;
  /** True while receiving from the notification queue fails. */
  failing: boolean;
  queues: ReadonlyMap<string, BrokerListenerQueueState>;
}

interface NotificationRow extends BrokerRow {
  conversation_handle: string;
  message_type_name: string;
  event_type: string | null;
  schema_name: string | null;
  object_name: string | null;
  this_database: number | boolean | null;
}

interface PollRow extends BrokerRow {
  has_messages: number | boolean;
  activation_exists: number | boolean;
  disabled_exists: number | boolean;
  is_receive_enabled: number | boolean | null;
}

const ERROR_BACKOFF_MIN_MS = 250;
const ERROR_BACKOFF_MAX_MS = 10_000;
/** Stop waits this long past a wait's timeout for the cancelled WAITFOR and a poll in flight. */
const STOP_GRACE_MS = 5_000;

/**
 * External activation (research B.3, seed 003), one per process while broker queues are
 * consumed. A receive loop on its own reader connection waits on the notification queue
 * (`WAITFOR (RECEIVE …)` in a transaction, then commit) and routes QUEUE_ACTIVATION events for
 * our database's queues to `activate(queue, 'notification')`; BROKER_QUEUE_DISABLED marks the
 * queue disabled (logged; the health reading shows it). A slow poll, every pollIntervalMs,
 * covers what notifications cannot: per consumed queue one statement says whether messages
 * wait (a queue with messages and no reader here gets one: a notification was lost), whether
 * its event notifications exist (missing ones are recreated and reported) and whether it is
 * enabled again.
 *
 * The listener never ends a live notification dialog: the server keeps one open per event
 * notification, and "ending some or all conversations explicitly might prevent the target
 * service from receiving more messages" (CREATE EVENT NOTIFICATION). It only ends dialogs the
 * server already broke (see handleBrokenDialogs).
 */
export class BrokerActivationListener {
  private readonly byObject = new Map<string, ResolvedBrokerQueue>();
  private readonly states = new Map<string, BrokerListenerQueueState>();
  private started = false;
  private stopping = false;
  private stopped: Promise<void> | null = null;
  private lastLoopAt = 0;
  /** The receive loop's transaction, and whether its WAITFOR is in flight (only that is cancelled). */
  private session: BrokerSession | null = null;
  private waiting = false;
  private loopDone: Promise<void> = Promise.resolve();
  private pollDone: Promise<void> = Promise.resolve();
  private polling = false;
  private pollAgain = false;
  private pollTimer: { cancel(): void } | null = null;
  private readonly stopSignal = new AbortController();
  private readonly receiveErrors: ThrottledErrorLog;
  private readonly pollErrors: ThrottledErrorLog;

  constructor(private readonly deps: BrokerListenerDeps) {
    for (const queue of deps.queues) {
      this.byObject.set(objectKey(queue.queue.schema, queue.queue.name), queue);
      this.states.set(queue.name, { disabledSeen: false, notificationProblem: null });
    }
    const now = () => deps.clock.now();
    const where = brokerObjectText(deps.options.notificationQueue);
    this.receiveErrors = new ThrottledErrorLog(deps.logger, `receiving activation events from ${where}`, now);
    this.pollErrors = new ThrottledErrorLog(deps.logger, 'polling broker queues for lost activations', now);
  }

  /** Starts the receive loop and the poll (one poll at once: it checks the event notifications at boot). */
  start(): void {
    if (this.started || this.stopping) return;
    this.started = true;
    this.lastLoopAt = this.deps.clock.now();
    this.loopDone = this.receiveLoop();
    this.requestPoll();
    this.pollTimer = this.deps.clock.setInterval(() => this.requestPoll(), this.deps.options.pollIntervalMs);
  }

  snapshot(): BrokerListenerSnapshot {
    return {
      running: this.started && !this.stopping,
      lastLoopAt: this.lastLoopAt,
      failing: this.receiveErrors.failing,
      queues: this.states,
    };
  }

  /**
   * Stops the poll and the receive loop: an idle WAITFOR is cancelled and its transaction
   * committed (it received nothing; a rollback of a RECEIVE is what counts toward disabling a
   * queue). Resolves once both ended, or a bounded time later.
   */
  stop(): Promise<void> {
    this.stopped ??= this.shutDown();
    return this.stopped;
  }

  private async shutDown(): Promise<void> {
    this.stopping = true;
    this.pollTimer?.cancel();
    this.stopSignal.abort();
    if (this.waiting) this.session?.cancel();
    const bound = this.deps.options.waitTimeoutMs + STOP_GRACE_MS;
    if (!(await settleWithin(Promise.all([this.loopDone, this.pollDone]), bound))) {
      this.deps.logger.warn(
        `the Service Broker activation listener did not stop within ${bound} ms (database unresponsive?); its transaction ends with its connection`,
      );
    }
  }

  // ---- the receive loop -------------------------------------------------------------------

  private async receiveLoop(): Promise<void> {
    const backoff = new PollBackoff(ERROR_BACKOFF_MIN_MS, ERROR_BACKOFF_MAX_MS, this.deps.random ?? Math.random);
    while (!this.stopping) {
      let session: BrokerSession | null = null;
      try {
        session = await this.deps.driver.beginReader();
        this.session = session;
        const rows = await this.receive(session);
        if (rows === null) {
          await session.commit();
          return;
        }
        await this.handleBrokenDialogs(session, rows);
        await session.commit();
        session = null;
        this.lastLoopAt = this.deps.clock.now();
        this.receiveErrors.succeeded();
        backoff.reset();
        this.route(rows);
      } catch (error) {
        if (session) await commitOrRollback(session);
        if (this.stopping) return;
        const pause = backoff.next();
        this.receiveErrors.failed(error, pause);
        await this.deps.clock.sleep(pause, this.stopSignal.signal);
      } finally {
        this.session = null;
      }
    }
  }

  /** One WAITFOR (RECEIVE); null when shutdown began before it was sent. */
  private async receive(session: BrokerSession): Promise<NotificationRow[] | null> {
    // Checked and sent in the same turn as stop() checks `waiting`: a stop either sees the
    // WAITFOR in flight and cancels it, or this sees the stop and sends nothing.
    if (this.stopping) return null;
    this.waiting = true;
    try {
      return await session.query<NotificationRow>(receiveNotifications(this.deps.options.notificationQueue), {
        timeoutMs: { type: 'int', value: this.deps.options.waitTimeoutMs },
        eventNotificationType: { type: 'nvarchar', value: BROKER_SYSTEM.EVENT_NOTIFICATION },
      });
    } finally {
      this.waiting = false;
    }
  }

  /**
   * An EndDialog or Error on the notification queue means the server broke the dialog of an
   * event notification, and with it dropped the event notification ("If the conversation
   * between the server and the target service is broken after an event notification fires, an
   * error is reported and the event notification is dropped", CREATE EVENT NOTIFICATION). That
   * dialog is dead: ending our side is cleanup that frees its endpoint, not the forbidden ending
   * of a live notification dialog. Ended in the same transaction as the RECEIVE.
   */
  private async handleBrokenDialogs(session: BrokerSession, rows: readonly NotificationRow[]): Promise<void> {
    const ended = new Set<string>();
    for (const row of rows) {
      if (!isEnd(row.message_type_name) || ended.has(row.conversation_handle)) continue;
      ended.add(row.conversation_handle);
      await session.query(endBrokenNotificationDialog(), {
        handle: { type: 'uniqueidentifier', value: row.conversation_handle },
      });
    }
  }

  private route(rows: readonly NotificationRow[]): void {
    let broken = 0;
    for (const row of rows) {
      if (isEnd(row.message_type_name)) {
        broken++;
        continue;
      }
      if (row.message_type_name !== BROKER_SYSTEM.EVENT_NOTIFICATION) continue; // DialogTimer: nothing to do
      if (!truthy(row.this_database) || row.schema_name === null || row.object_name === null) continue;
      const queue = this.byObject.get(objectKey(row.schema_name, row.object_name));
      if (!queue) continue; // a queue of another app sharing the notification service, or not consumed here
      if (row.event_type === BROKER_EVENT.QUEUE_ACTIVATION) this.deps.activate(queue.name, 'notification');
      else if (row.event_type === BROKER_EVENT.BROKER_QUEUE_DISABLED)
        this.markDisabled(queue, 'a BROKER_QUEUE_DISABLED event arrived');
    }
    if (broken > 0) {
      this.deps.logger.warn(
        `${broken} event notification dialog(s) on ${brokerObjectText(this.deps.options.notificationQueue)} were broken by the server (EndDialog or Error), which drops their event notifications; checking every queue's event notifications now`,
      );
      this.requestPoll();
    }
  }

  private markDisabled(queue: ResolvedBrokerQueue, why: string): void {
    const state = this.states.get(queue.name)!;
    if (state.disabledSeen) return;
    state.disabledSeen = true;
    this.deps.logger.error(
      `broker queue '${queue.name}': SQL Server disabled queue ${quoteBrokerObject(queue.queue)} (${why}); readers keep trying. Usually five rollbacks in a row (a poison message): find the cause, then run ALTER QUEUE ${quoteBrokerObject(queue.queue)} WITH STATUS = ON`,
    );
  }

  // ---- the slow poll ----------------------------------------------------------------------

  /** Runs a poll now, or right after the one in flight. */
  private requestPoll(): void {
    if (this.stopping) return;
    if (this.polling) {
      this.pollAgain = true;
      return;
    }
    this.pollDone = this.poll();
  }

  private async poll(): Promise<void> {
    this.polling = true;
    try {
      do {
        this.pollAgain = false;
        for (const queue of this.deps.queues) {
          if (this.stopping) return;
          await this.check(queue);
        }
      } while (this.pollAgain && !this.stopping);
    } finally {
      this.polling = false;
    }
  }

  private async check(queue: ResolvedBrokerQueue): Promise<void> {
    let row: PollRow | undefined;
    try {
      const rows = await withTimeout(
        this.deps.driver.query<PollRow>(pollBrokerQueue(queue.queue), {
          queue: { type: 'nvarchar', value: quoteBrokerObject(queue.queue) },
          activationName: { type: 'nvarchar', value: queue.activationNotification },
          disabledName: { type: 'nvarchar', value: queue.disabledNotification },
        }),
        Math.max(1_000, this.deps.options.pollIntervalMs),
        `polling broker queue '${queue.name}'`,
      );
      row = rows[0];
      this.pollErrors.succeeded();
    } catch (error) {
      this.pollErrors.failed(error, this.deps.options.pollIntervalMs);
      return;
    }
    if (!row || this.stopping) return;
    const state = this.states.get(queue.name)!;

    if (row.is_receive_enabled !== null && !truthy(row.is_receive_enabled)) {
      this.markDisabled(queue, 'is_receive_enabled = 0');
    } else if (row.is_receive_enabled !== null && state.disabledSeen) {
      state.disabledSeen = false;
      this.deps.logger.log(`broker queue '${queue.name}': queue ${quoteBrokerObject(queue.queue)} is enabled again`);
    }

    const missing = [
      truthy(row.activation_exists) ? null : queue.activationNotification,
      truthy(row.disabled_exists) ? null : queue.disabledNotification,
    ].filter((name): name is string => name !== null);
    if (missing.length > 0) await this.recover(queue, missing);
    else if (state.notificationProblem !== null) {
      state.notificationProblem = null;
      this.deps.logger.log(`broker queue '${queue.name}': its event notifications exist again`);
    }

    // A queue with ready messages and no reader here: its notification was lost (or went to
    // another process that has since stopped). One reader is enough to look: if there is more
    // work, the server notifies again once it RECEIVEs.
    if (truthy(row.has_messages) && this.deps.readersOf(queue.name) === 0) this.deps.activate(queue.name, 'poll');
  }

  /** Missing event notifications: recreated with setup 'auto', else reported with the fix. Unhealthy until they exist. */
  private async recover(queue: ResolvedBrokerQueue, missing: readonly string[]): Promise<void> {
    const state = this.states.get(queue.name)!;
    const problem = `event notification ${missing.join(' and ')} on queue ${quoteBrokerObject(queue.queue)} is missing (dropped, or its dialog broke)`;
    const firstSeen = state.notificationProblem === null;
    state.notificationProblem = problem;
    if (this.deps.options.setup !== 'auto') {
      if (firstSeen) {
        this.deps.logger.error(
          `broker queue '${queue.name}': ${problem}; broker.setup is '${this.deps.options.setup}', so it is not recreated: run the broker setup script (broker.setup 'print' logs it), or set broker.setup to 'auto'`,
        );
        safeEmit(this.deps.listeners, 'brokerNotificationLost', { queue: queue.name, problem, recreated: false });
      }
      return;
    }
    try {
      await this.deps.recreateNotifications(queue);
    } catch (error) {
      if (firstSeen) {
        this.deps.logger.error(
          `broker queue '${queue.name}': ${problem}; recreating it failed: ${describe(error)}. It needs ALTER permission on the queue; the poll tries again every ${this.deps.options.pollIntervalMs} ms`,
        );
        safeEmit(this.deps.listeners, 'brokerNotificationLost', { queue: queue.name, problem, recreated: false });
      }
      return;
    }
    state.notificationProblem = null;
    this.deps.logger.warn(`broker queue '${queue.name}': ${problem}; recreated it`);
    safeEmit(this.deps.listeners, 'brokerNotificationLost', { queue: queue.name, problem, recreated: true });
  }
}

function isEnd(messageType: string): boolean {
  return messageType === BROKER_SYSTEM.END_DIALOG || messageType === BROKER_SYSTEM.ERROR;
}

/** SQL Server compares these names case-insensitively under the usual collations; so do we. */
function objectKey(schema: string, name: string): string {
  return `${schema.toLowerCase()}.${name.toLowerCase()}`;
}

/** bit columns arrive as booleans, CASE … THEN 1 as numbers. */
function truthy(value: unknown): boolean {
  return value === true || value === 1;
}

function describe(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
