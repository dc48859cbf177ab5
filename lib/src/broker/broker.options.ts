import type { BackoffOption } from '../core/backoff.js';
import { SqlQueueConfigError } from '../core/errors.js';
import { QUEUE_OPTION_KEYS, validateQueueOptions, type QueueOptions } from '../core/options.js';
import {
  assertBoolean,
  assertInteger,
  assertOptionGroup,
  assertQueueName,
  DAY_MS,
  describe,
  INT_MAX,
} from '../core/validation.js';
import {
  assertBrokerName,
  assertDerivedQueueName,
  BROKER_ACTIVATION_NOTIFICATION,
  BROKER_DISABLED_NOTIFICATION,
  BROKER_NAME_PREFIX,
  brokerDefaultNames,
  brokerNotificationQueue,
  brokerNotificationService,
  brokerObjectText,
  parseBrokerQueueName,
} from './broker.names.js';
import type {
  BrokerBodyFormat,
  BrokerObjectName,
  BrokerOptions,
  BrokerQueueOptions,
  BrokerSetupMode,
  ResolvedBrokerOptions,
  ResolvedBrokerQueue,
} from './broker.types.js';

/** Every option of `broker`; a compile error reminds whoever adds one to BrokerOptions. */
const BROKER_OPTIONS: Record<keyof BrokerOptions, true> = {
  queues: true,
  setup: true,
  enableBroker: true,
  waitTimeoutMs: true,
  requestTimeoutMs: true,
  pollIntervalMs: true,
  unkeyedDialogs: true,
  dialogRecycleMs: true,
  doorbell: true,
};

/** The broker-side options of a queue; the rest of BrokerQueueOptions are table-queue options (QueueOptions). */
const BROKER_QUEUE_OPTIONS: Record<Exclude<keyof BrokerQueueOptions, keyof QueueOptions>, true> = {
  queue: true,
  service: true,
  contract: true,
  messageType: true,
  closeMessageType: true,
  initiatorQueue: true,
  initiatorService: true,
  format: true,
  minReceivers: true,
  maxReceivers: true,
  messagesPerTransaction: true,
};

const SETUP_MODES: readonly BrokerSetupMode[] = ['auto', 'print', 'off'];
const FORMATS: readonly BrokerBodyFormat[] = ['json', 'raw', 'xml'];

/**
 * What a reader connection's request timeout must exceed the WAITFOR timeout by: tedious
 * clears its request timer only when the response starts, and an idle WAITFOR sends nothing
 * until its TIMEOUT, so a smaller margin would cancel idle waits.
 */
export const BROKER_REQUEST_TIMEOUT_MARGIN_MS = 5_000;

/** The most messages one move transaction takes (messagesPerTransaction). */
export const BROKER_MAX_MESSAGES_PER_TRANSACTION = 1_000;

/** Default retry delay of a failed broker message: 1 s doubling to 1 min, equal jitter. */
export const BROKER_DEFAULT_BACKOFF: BackoffOption = {
  type: 'exponential',
  baseMs: 1_000,
  factor: 2,
  maxMs: 60_000,
  jitter: 'equal',
};

/**
 * The handler side's defaults where a broker queue differs from a table queue: fewer attempts
 * and a shorter backoff (a conversation waits behind its failing message), and group batches
 * of 10 (a conversation is usually deep: one dialog carries every message of a key).
 */
export const BROKER_HANDLER_DEFAULTS = {
  maxAttempts: 5,
  backoff: BROKER_DEFAULT_BACKOFF,
  groupBatchSize: 10,
} as const satisfies QueueOptions;

/**
 * Checks the module option `broker` and fills in every default; null when it is absent.
 * `schema` is the module schema (already validated): default names derive from it, and the
 * notification queue and our Broker* tables live there. `tableQueueNames` are the table
 * queues the module knows (its `queues` map and handlers): a broker queue may not share a
 * name with one, since `@QueueHandler(name)` and `send(name, …)` must mean one thing.
 *
 * Defaults: setup 'auto', enableBroker false, waitTimeoutMs 5,000, requestTimeoutMs
 * waitTimeoutMs + 15,000, pollIntervalMs 10,000, unkeyedDialogs 8, dialogRecycleMs one day;
 * per queue: format 'json', minReceivers 1, maxReceivers 2 (or minReceivers, if larger),
 * messagesPerTransaction 100, and for its handlers the table-queue defaults but
 * BROKER_HANDLER_DEFAULTS. Names: see brokerDefaultNames.
 */
export function resolveBrokerOptions(
  raw: BrokerOptions | undefined,
  schema: string,
  tableQueueNames: readonly string[] = [],
): ResolvedBrokerOptions | null {
  if (raw === undefined || raw === null) return null;
  const o = assertOptionGroup('broker', raw, Object.keys(BROKER_OPTIONS));
  const doorbell = o.doorbell === undefined ? false : assertBoolean('broker.doorbell', o.doorbell);
  if (o.queues === undefined && !doorbell) {
    throw new SqlQueueConfigError(
      'broker.queues is required: declare each broker queue by name, e.g. broker: { queues: { orders: {} } }',
    );
  }
  const queueMap = assertOptionGroup('broker.queues', (o.queues ?? {}) as Record<string, BrokerQueueOptions>);

  const setup = o.setup ?? 'auto';
  if (!SETUP_MODES.includes(setup)) {
    throw new SqlQueueConfigError(`broker.setup must be 'auto', 'print' or 'off', got ${describe(setup)}`);
  }
  const enableBroker = o.enableBroker === undefined ? false : assertBoolean('broker.enableBroker', o.enableBroker);
  const waitTimeoutMs = assertInteger('broker.waitTimeoutMs', o.waitTimeoutMs ?? 5_000, 1, 600_000);
  const requestTimeoutMs = assertInteger(
    'broker.requestTimeoutMs',
    o.requestTimeoutMs ?? waitTimeoutMs + 15_000,
    1,
    INT_MAX,
  );
  if (requestTimeoutMs <= waitTimeoutMs + BROKER_REQUEST_TIMEOUT_MARGIN_MS) {
    throw new SqlQueueConfigError(
      `broker.requestTimeoutMs (${requestTimeoutMs}) must exceed broker.waitTimeoutMs (${waitTimeoutMs}) by more than ${BROKER_REQUEST_TIMEOUT_MARGIN_MS} ms, or the driver cancels every idle WAITFOR: raise broker.requestTimeoutMs above ${waitTimeoutMs + BROKER_REQUEST_TIMEOUT_MARGIN_MS} or lower broker.waitTimeoutMs (leave requestTimeoutMs out to get waitTimeoutMs + 15000)`,
    );
  }
  const pollIntervalMs = assertInteger('broker.pollIntervalMs', o.pollIntervalMs ?? 10_000, 100, DAY_MS);
  const unkeyedDialogs = assertInteger('broker.unkeyedDialogs', o.unkeyedDialogs ?? 8, 1, 1_000);
  const dialogRecycleMs =
    o.dialogRecycleMs === null
      ? null
      : assertInteger('broker.dialogRecycleMs', o.dialogRecycleMs ?? DAY_MS, 1_000, INT_MAX);

  const tableQueues = new Set(tableQueueNames);
  const queues = Object.entries(queueMap).map(([name, options]) =>
    resolveBrokerQueue(name, options, schema, tableQueues),
  );
  if (queues.length === 0 && !doorbell) {
    throw new SqlQueueConfigError(
      'broker.queues is empty: declare at least one broker queue (or set broker.doorbell), or leave the broker option out',
    );
  }
  const resolved: ResolvedBrokerOptions = {
    schema,
    setup,
    enableBroker,
    waitTimeoutMs,
    requestTimeoutMs,
    pollIntervalMs,
    unkeyedDialogs,
    dialogRecycleMs,
    notificationQueue: brokerNotificationQueue(schema),
    notificationService: brokerNotificationService(schema),
    queues,
    doorbell: doorbell ? doorbellQueue(schema) : null,
  };
  assertDistinctObjects(resolved);
  return resolved;
}

function resolveBrokerQueue(
  name: string,
  raw: BrokerQueueOptions,
  schema: string,
  tableQueues: ReadonlySet<string>,
): ResolvedBrokerQueue {
  assertQueueName(name, SqlQueueConfigError);
  const where = `broker.queues['${name}']`;
  if (tableQueues.has(name)) {
    throw new SqlQueueConfigError(
      `${where}: '${name}' is also a table queue; a name is either a table queue or a broker queue (send() and @QueueHandler() take the name alone): rename one of them`,
    );
  }
  const o = assertOptionGroup(where, raw, [...Object.keys(BROKER_QUEUE_OPTIONS), ...QUEUE_OPTION_KEYS]);
  const defaults = brokerDefaultNames(schema, name);

  const objectName = (key: 'queue' | 'initiatorQueue'): BrokerObjectName =>
    o[key] === undefined
      ? assertDerivedQueueName(`${where}.${key}`, defaults[key])
      : parseBrokerQueueName(`${where}.${key}`, o[key], schema);
  const brokerName = (key: 'service' | 'initiatorService' | 'contract' | 'messageType' | 'closeMessageType'): string =>
    o[key] === undefined
      ? assertBrokerName(`${where}.${key}`, defaults[key], true)
      : assertBrokerName(`${where}.${key}`, o[key]);

  const format = o.format ?? 'json';
  if (!FORMATS.includes(format)) {
    throw new SqlQueueConfigError(`${where}.format must be 'json', 'raw' or 'xml', got ${describe(format)}`);
  }
  const minReceivers = assertInteger(`${where}.minReceivers`, o.minReceivers ?? 1, 1, 100);
  const maxReceivers = assertInteger(`${where}.maxReceivers`, o.maxReceivers ?? Math.max(2, minReceivers), 1, 100);
  if (minReceivers > maxReceivers) {
    throw new SqlQueueConfigError(
      `${where}: minReceivers (${minReceivers}) is greater than maxReceivers (${maxReceivers})`,
    );
  }
  const tableOptions = Object.fromEntries(
    Object.entries(o).filter(([key]) => (QUEUE_OPTION_KEYS as readonly string[]).includes(key)),
  ) as QueueOptions;
  const handlerOptions = validateQueueOptions(where, { ...BROKER_HANDLER_DEFAULTS, ...tableOptions });
  const { minReaders, maxReaders } = handlerOptions;
  if (minReaders !== undefined && maxReaders !== undefined && minReaders > maxReaders) {
    throw new SqlQueueConfigError(`${where}: minReaders (${minReaders}) is greater than maxReaders (${maxReaders})`);
  }
  const resolved: ResolvedBrokerQueue = {
    name,
    queue: objectName('queue'),
    service: brokerName('service'),
    contract: brokerName('contract'),
    messageType: brokerName('messageType'),
    closeMessageType: brokerName('closeMessageType'),
    initiatorQueue: objectName('initiatorQueue'),
    initiatorService: brokerName('initiatorService'),
    activationNotification: BROKER_ACTIVATION_NOTIFICATION,
    disabledNotification: BROKER_DISABLED_NOTIFICATION,
    format,
    minReceivers,
    maxReceivers,
    messagesPerTransaction: assertInteger(
      `${where}.messagesPerTransaction`,
      o.messagesPerTransaction ?? 100,
      1,
      BROKER_MAX_MESSAGES_PER_TRANSACTION,
    ),
    handlerOptions,
  };
  if (resolved.messageType === resolved.closeMessageType) {
    throw new SqlQueueConfigError(
      `${where}: messageType and closeMessageType are both '${resolved.messageType}': the close message must have a type of its own`,
    );
  }
  return resolved;
}

/** The name the doorbell goes by in BrokerDialogs and logs: no broker queue can have it ('~'). */
export const DOORBELL_NAME = '~doorbell';

/**
 * The doorbell of module schema S (broker.doorbell): queue `[S].[DoorbellQueue]`, initiator
 * queue `[S].[DoorbellInitiatorQueue]`, service `nestjs-sql-queue/S/doorbell`, and its
 * initiator service, contract and `ring`/`close` message types under that name. A ring's body
 * is the table queue's name; rings travel on shared dialogs like unkeyed sends.
 */
export function doorbellQueue(schema: string): ResolvedBrokerQueue {
  const base = `${BROKER_NAME_PREFIX}/${schema}/doorbell`;
  return {
    name: DOORBELL_NAME,
    queue: { schema, name: 'DoorbellQueue' },
    service: assertBrokerName('broker.doorbell', base, true),
    contract: assertBrokerName('broker.doorbell', `${base}/contract`, true),
    messageType: assertBrokerName('broker.doorbell', `${base}/ring`, true),
    closeMessageType: assertBrokerName('broker.doorbell', `${base}/close`, true),
    initiatorQueue: { schema, name: 'DoorbellInitiatorQueue' },
    initiatorService: assertBrokerName('broker.doorbell', `${base}/initiator`, true),
    activationNotification: BROKER_ACTIVATION_NOTIFICATION,
    disabledNotification: BROKER_DISABLED_NOTIFICATION,
    format: 'raw',
    minReceivers: 1,
    maxReceivers: 1,
    messagesPerTransaction: 100,
    handlerOptions: {},
    doorbell: true,
  };
}

/** Every queue whose objects the setup creates and checks: the broker queues and the doorbell. */
export function brokerSetupQueues(options: ResolvedBrokerOptions): ResolvedBrokerQueue[] {
  return options.doorbell ? [...options.queues, options.doorbell] : options.queues;
}

/**
 * Each broker queue needs queues and services of its own: two broker queues reading one SQL
 * queue would take each other's messages, and a service is the address of one queue. Message
 * types and contracts may be shared, as long as every user defines them the same way.
 */
function assertDistinctObjects(options: ResolvedBrokerOptions): void {
  const queueOwners = new Map<string, string>([
    [brokerObjectText(options.notificationQueue).toLowerCase(), 'the notification queue'],
  ]);
  const serviceOwners = new Map<string, string>([[options.notificationService, 'the notification service']]);
  const claim = (owners: Map<string, string>, key: string, owner: string, what: string, fix: string) => {
    const other = owners.get(key);
    if (other !== undefined) {
      throw new SqlQueueConfigError(`${owner} and ${other} both use the ${what}: ${fix}`);
    }
    owners.set(key, owner);
  };
  const messageTypes = new Map<string, { owner: string; validation: string }>();
  const contracts = new Map<string, { owner: string; definition: string }>();

  for (const q of brokerSetupQueues(options)) {
    const where = q.doorbell ? 'broker.doorbell' : `broker.queues['${q.name}']`;
    for (const key of ['queue', 'initiatorQueue'] as const) {
      // SQL Server object names are compared in the database collation, usually case-insensitive.
      claim(
        queueOwners,
        brokerObjectText(q[key]).toLowerCase(),
        `${where}.${key}`,
        `queue ${brokerObjectText(q[key])}`,
        `give each its own queue`,
      );
    }
    for (const key of ['service', 'initiatorService'] as const) {
      claim(serviceOwners, q[key], `${where}.${key}`, `service '${q[key]}'`, 'give each its own service');
    }
    const validation = q.format === 'xml' ? 'WELL_FORMED_XML' : 'NONE';
    for (const [key, type, wanted] of [
      ['messageType', q.messageType, validation],
      ['closeMessageType', q.closeMessageType, 'NONE'],
    ] as const) {
      const seen = messageTypes.get(type);
      if (seen && seen.validation !== wanted) {
        throw new SqlQueueConfigError(
          `${where}.${key} '${type}' is also ${seen.owner}, with another validation (${seen.validation}, here ${wanted}; format 'xml' needs WELL_FORMED_XML): give them separate message types`,
        );
      }
      messageTypes.set(type, seen ?? { owner: `${where}.${key}`, validation: wanted });
    }
    const definition = `${q.messageType} ${q.closeMessageType}`;
    const seenContract = contracts.get(q.contract);
    if (seenContract && seenContract.definition !== definition) {
      throw new SqlQueueConfigError(
        `${where}.contract '${q.contract}' is also ${seenContract.owner}, with other message types: a contract lists one set of message types, so give them separate contracts`,
      );
    }
    contracts.set(q.contract, seenContract ?? { owner: `${where}.contract`, definition });
  }
}
