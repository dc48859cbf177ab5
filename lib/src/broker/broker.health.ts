import { readBrokerQueueHealth, readBrokerQueueLocks } from './activation/index.js';
import { quoteBrokerObject } from './broker.names.js';
import type {
  BrokerDriver,
  BrokerHealthReading,
  BrokerRow,
  BrokerSnapshot,
  ResolvedBrokerOptions,
} from './broker.types.js';

interface LocksRow extends BrokerRow {
  SchemaLockWaiters: number | string;
  HolderSession: number | null;
  HolderAgeMs: number | string | null;
}

/**
 * A transaction that has held a broker queue this long is reported: ours hold it for a move
 * (milliseconds) or an idle wait (waitTimeoutMs); the bound is this many waits, and at least
 * BROKER_QUEUE_HOLD_MIN_MS.
 */
export const BROKER_QUEUE_HOLD_FACTOR = 3;
export const BROKER_QUEUE_HOLD_MIN_MS = 30_000;

interface HealthRow extends BrokerRow {
  is_broker_enabled: boolean | number | null;
  is_receive_enabled: boolean | number | null;
  is_enqueue_enabled: boolean | number | null;
  activation_exists: boolean | number;
}

/**
 * The activation listener counts as alive while its last completed round is at most this
 * many (waitTimeoutMs + pollIntervalMs) old: a round takes up to one wait, and a failing one
 * backs off; twice that leaves room for one slow round.
 */
export const LISTENER_ALIVE_FACTOR = 2;

/**
 * Reads the health of broker queue `queueName`: one bounded batch of catalog views (the broker
 * is on in this database, the queue exists and is receive- and enqueue-enabled, its activation
 * event notification exists), one of the lock manager (no schema-modification lock waits on the
 * queue, no transaction has held it for long), combined with this process's snapshot when it
 * consumes the queue (the activation listener made progress within 2 × (waitTimeoutMs +
 * pollIntervalMs), no event notification problem is pending, no BROKER_QUEUE_DISABLED is
 * unresolved). The messages' handlers are the table queue's: the backlog check covers them.
 * Framework-free; the Terminus indicator wraps it with a time bound. `now` is the engine clock
 * the snapshot's times are on.
 */
export async function readBrokerHealth(
  driver: Pick<BrokerDriver, 'query'>,
  options: ResolvedBrokerOptions,
  queueName: string,
  snapshot: BrokerSnapshot | null,
  now: number = Date.now(),
): Promise<BrokerHealthReading> {
  const queue = options.queues.find((q) => q.name === queueName);
  if (!queue) {
    const known = options.queues.map((q) => `'${q.name}'`).join(', ') || 'none';
    return {
      healthy: false,
      problems: [`'${queueName}' is not a broker queue (declared under broker.queues: ${known})`],
      details: {},
    };
  }
  const quoted = quoteBrokerObject(queue.queue);
  const [row] = await driver.query<HealthRow>(readBrokerQueueHealth(), {
    queue: { type: 'nvarchar', value: quoted },
    activationName: { type: 'nvarchar', value: queue.activationNotification },
  });
  const problems: string[] = [];
  const brokerEnabled = flag(row?.is_broker_enabled);
  const receiveEnabled = flag(row?.is_receive_enabled);
  const enqueueEnabled = flag(row?.is_enqueue_enabled);
  const activationNotification = row !== undefined && flag(row.activation_exists) === true;
  if (brokerEnabled !== true) {
    problems.push(
      'Service Broker is disabled in this database (sys.databases.is_broker_enabled = 0): run ALTER DATABASE CURRENT SET ENABLE_BROKER WITH ROLLBACK IMMEDIATE (it disconnects other sessions)',
    );
  }
  if (receiveEnabled === null) {
    problems.push(`queue ${quoted} does not exist (or this login cannot see it): run the broker setup script`);
  } else {
    if (!receiveEnabled) {
      problems.push(
        `queue ${quoted} is disabled for receive (is_receive_enabled = 0), usually after five rollbacks in a row: find the cause, then run ALTER QUEUE ${quoted} WITH STATUS = ON`,
      );
    }
    if (enqueueEnabled === false) problems.push(`queue ${quoted} is disabled for enqueue (is_enqueue_enabled = 0)`);
    if (!activationNotification) {
      problems.push(
        `event notification ${queue.activationNotification} on queue ${quoted} is missing: readers start only through the slow poll until it is recreated`,
      );
    }
  }

  const locks = receiveEnabled === null ? null : await readLocks(driver, quoted, options, problems);

  const mine = snapshot?.queues.find((q) => q.queue === queueName);
  const consumed = snapshot !== null && mine?.consumed === true;
  const aliveWithinMs = LISTENER_ALIVE_FACTOR * (options.waitTimeoutMs + options.pollIntervalMs);
  const lastLoopAt = snapshot?.listenerLastLoopAt ?? null;
  const listenerAlive = lastLoopAt !== null && now - lastLoopAt <= aliveWithinMs;
  if (consumed) {
    if (!snapshot.running) problems.push('the broker consumer of this process is not running');
    else if (!listenerAlive) {
      problems.push(
        lastLoopAt === null
          ? 'the activation listener is not running'
          : `the activation listener made no progress for ${now - lastLoopAt} ms (limit ${aliveWithinMs} ms): the notification queue cannot be read`,
      );
    }
    // Poison handling is off (the table queue is the poison handler), so a move the server
    // refuses every time would stop the queue's messages reaching the handlers with nothing but
    // a log line: past the bound it makes the probe fail.
    const failingBoundMs = Math.max(BROKER_QUEUE_HOLD_MIN_MS, BROKER_QUEUE_HOLD_FACTOR * options.waitTimeoutMs);
    if (mine.failingSince !== null && now - mine.failingSince > failingBoundMs) {
      problems.push(
        `the receivers of broker queue '${queueName}' have failed every round for ${now - mine.failingSince} ms (limit ${failingBoundMs} ms; last error: ${mine.lastError ?? 'unknown'}): its messages are not reaching the handlers`,
      );
    }
    // The catalog check above already reports a missing activation notification.
    if (mine.notificationProblem !== null && activationNotification) problems.push(mine.notificationProblem);
  }

  return {
    healthy: problems.length === 0,
    problems: [...new Set(problems)],
    details: {
      queue: quoted,
      brokerEnabled,
      receiveEnabled,
      enqueueEnabled,
      activationNotification,
      ...(locks ? { locks } : {}),
      consumed,
      ...(consumed
        ? {
            listenerAlive,
            listenerLastLoopAt: lastLoopAt,
            receivers: mine.receivers,
            busyReceivers: mine.busyReceivers,
            lastActivationAt: mine.lastActivationAt,
            disabledSeen: mine.disabledSeen,
            receiversFailingSince: mine.failingSince,
          }
        : {}),
    },
  };
}

/**
 * The lock manager's view of the queue (readBrokerQueueLocks): a waiting schema-modification
 * lock, or a transaction holding the queue longer than ours ever do, is a problem. Without the
 * permission to read it, the details say so and nothing is reported: it is a diagnosis, not
 * the queue's health.
 */
async function readLocks(
  driver: Pick<BrokerDriver, 'query'>,
  quoted: string,
  options: ResolvedBrokerOptions,
  problems: string[],
): Promise<Record<string, unknown>> {
  let row: LocksRow | undefined;
  try {
    [row] = await driver.query<LocksRow>(readBrokerQueueLocks(), { queue: { type: 'nvarchar', value: quoted } });
  } catch (error) {
    return {
      readable: false,
      reason: `${error instanceof Error ? error.message : String(error)} (reading sys.dm_tran_locks needs VIEW SERVER STATE)`,
    };
  }
  const waiters = Number(row?.SchemaLockWaiters ?? 0);
  const holder = row?.HolderSession ?? null;
  const holderAgeMs = row?.HolderAgeMs === null || row?.HolderAgeMs === undefined ? null : Number(row.HolderAgeMs);
  const boundMs = Math.max(BROKER_QUEUE_HOLD_MIN_MS, BROKER_QUEUE_HOLD_FACTOR * options.waitTimeoutMs);
  const held =
    holder !== null && holderAgeMs !== null
      ? ` by session ${holder}, whose transaction began ${holderAgeMs} ms ago`
      : '';
  if (waiters > 0) {
    problems.push(
      `a schema-modification lock waits on queue ${quoted}${held ? `, held${held}` : ''} (Service Broker's poison-message disable after five rolled-back receives, an ALTER QUEUE, or an event notification being changed): every RECEIVE, SEND and read of the queue waits behind it until that transaction ends`,
    );
  } else if (holderAgeMs !== null && holderAgeMs > boundMs) {
    problems.push(
      `queue ${quoted} has been held${held} (limit ${boundMs} ms; a transaction left open after a RECEIVE?): a schema change on the queue, the poison-message disable included, would wait for it and stop every reader and sender behind it`,
    );
  }
  return { readable: true, schemaLockWaiters: waiters, holderSession: holder, holderAgeMs };
}

/** A bit column: true/false, or null when the row or the object is missing. */
function flag(value: unknown): boolean | null {
  if (value === null || value === undefined) return null;
  return value === true || value === 1;
}
