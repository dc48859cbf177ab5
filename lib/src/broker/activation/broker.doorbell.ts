import { PollBackoff } from '../../core/backoff.js';
import { systemClock, type Clock } from '../../core/clock.js';
import type { QueueLogger } from '../../core/logger.js';
import { doorbellRingPending, receiveRings } from './broker.doorbell.queries.js';
import { BROKER_SYSTEM } from '../broker.names.js';
import { endConversation } from '../reader/index.js';
import { commitOrRollback } from '../driver/index.js';
import type { BrokerSender } from '../sender/index.js';
import type { BrokerDriver, BrokerSession, ResolvedBrokerQueue } from '../broker.types.js';

export interface BrokerDoorbellOptions {
  driver: BrokerDriver;
  sender: BrokerSender;
  /** The doorbell's resolved queue (ResolvedBrokerOptions.doorbell). */
  queue: ResolvedBrokerQueue;
  waitTimeoutMs: number;
  logger: QueueLogger;
  clock?: Clock;
}

/** Pause after a failed listen round: from 1 s, doubling, at most 30 s (polling still finds the work). */
const LISTEN_RETRY_MIN_MS = 1_000;
const LISTEN_RETRY_MAX_MS = 30_000;

/**
 * The table queue's cross-process wake-up on SQL Server: the counterpart of PostgreSQL's
 * LISTEN/NOTIFY, built on a Service Broker queue.
 *
 * - ring(queue) sends the table queue's name on one of the shared unkeyed dialogs, in its own
 *   short transaction, outside any producer's (the RemoteWaker calls it after an enqueue,
 *   coalesced per queue). It rings only when no ring of that queue is waiting already, so the
 *   doorbell queue stays small even while no process listens.
 * - listen(onWake) keeps one reader in `WAITFOR (RECEIVE …)` and calls onWake once per table
 *   queue named by the rings it got. A ring is a message, received once: it wakes one
 *   listening process, and each ring the producers send wakes another. Wake-ups are an
 *   optimization: readers still poll, so a lost ring costs latency, never a job.
 */
export class BrokerDoorbell {
  private readonly clock: Clock;

  constructor(private readonly options: BrokerDoorbellOptions) {
    this.clock = options.clock ?? systemClock;
  }

  async ring(tableQueue: string): Promise<void> {
    const { driver, sender, queue } = this.options;
    const body = Buffer.from(tableQueue, 'utf8');
    const session = await driver.begin();
    try {
      const [pending] = await session.query<{ Pending: number | boolean }>(doorbellRingPending(queue), {
        doorbell: { type: 'nvarchar', value: queue.name },
        ringType: { type: 'nvarchar', value: queue.messageType },
        body: { type: 'varbinary', value: body },
      });
      if (!Number(pending?.Pending ?? 0)) await sender.sendIn(session, queue, sender.unkeyedDialogKey(), body);
      await session.commit();
    } catch (error) {
      await session.rollback().catch(() => undefined);
      throw error;
    }
  }

  /** Starts listening; the returned function stops it (cancels the idle wait) and resolves when it has. */
  async listen(onWake: (tableQueue: string) => void): Promise<() => Promise<void>> {
    const stop = new AbortController();
    let session: BrokerSession | null = null;
    let waiting = false;
    const loop = (async () => {
      const backoff = new PollBackoff(LISTEN_RETRY_MIN_MS, LISTEN_RETRY_MAX_MS);
      while (!stop.signal.aborted) {
        try {
          session = await this.options.driver.beginReader();
          const woken = await this.round(
            session,
            () => (waiting = true),
            () => (waiting = false),
            stop.signal,
          );
          session = null;
          backoff.reset();
          for (const queue of woken) onWake(queue);
        } catch (error) {
          const open: BrokerSession | null = session;
          session = null;
          if (open) await commitOrRollback(open);
          if (stop.signal.aborted) break;
          this.options.logger.warn(
            `Service Broker doorbell: listening failed (${(error as Error).message}); readers keep polling, trying again`,
          );
          await this.clock.sleep(backoff.next(), stop.signal);
        }
      }
    })();
    return async () => {
      stop.abort();
      if (waiting) (session as BrokerSession | null)?.cancel();
      await loop;
    };
  }

  /** One transaction: wait for rings, end conversations that ended, commit. Never a rollback. */
  private async round(
    session: BrokerSession,
    startWait: () => void,
    endWait: () => void,
    stopped: AbortSignal,
  ): Promise<Set<string>> {
    const { queue, driver } = this.options;
    const woken = new Set<string>();
    let rows: { conversation_handle: string; message_type_name: string; message_body: Buffer | null }[] = [];
    // stop() while the connection was being acquired had no wait to cancel: do not begin one.
    if (stopped.aborted) {
      await session.commit();
      return woken;
    }
    startWait();
    try {
      rows = await session.query(receiveRings(queue.queue), {
        timeoutMs: { type: 'int', value: this.options.waitTimeoutMs },
      });
    } catch (error) {
      // stop() cancelled the idle wait: nothing was received; commit ends the transaction.
      if (!(stopped.aborted && driver.isCancelled(error))) throw error;
    } finally {
      endWait();
    }
    for (const row of rows) {
      if (row.message_type_name === queue.messageType) {
        if (row.message_body) woken.add(row.message_body.toString('utf8'));
      } else if (
        row.message_type_name === BROKER_SYSTEM.END_DIALOG ||
        row.message_type_name === BROKER_SYSTEM.ERROR ||
        row.message_type_name === queue.closeMessageType
      ) {
        // Both sides end a conversation: the rings' dialogs are recycled like any unkeyed dialog.
        await session.query(endConversation(), {
          handle: { type: 'uniqueidentifier', value: row.conversation_handle },
        });
      }
    }
    await session.commit();
    return woken;
  }
}
