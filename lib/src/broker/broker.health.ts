import { readBrokerQueueHealth } from './broker.listener.queries.js';
import { quoteBrokerObject } from './broker.names.js';
import type {
  BrokerDriver,
  BrokerHealthReading,
  BrokerRow,
  BrokerSnapshot,
  ResolvedBrokerOptions,
} from './broker.types.js';

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
 * event notification exists), combined with this process's snapshot when it consumes the
 * queue (the activation listener made progress within 2 × (waitTimeoutMs + pollIntervalMs),
 * no event notification problem is pending, no BROKER_QUEUE_DISABLED is unresolved).
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
      consumed,
      ...(consumed
        ? {
            listenerAlive,
            listenerLastLoopAt: lastLoopAt,
            readers: mine.readers,
            busyReaders: mine.busyReaders,
            lastActivationAt: mine.lastActivationAt,
            disabledSeen: mine.disabledSeen,
          }
        : {}),
    },
  };
}

/** A bit column: true/false, or null when the row or the object is missing. */
function flag(value: unknown): boolean | null {
  if (value === null || value === undefined) return null;
  return value === true || value === 1;
}
