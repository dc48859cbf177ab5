import { brokerSetupQueues } from '../broker.options.js';
import { assertPrincipalName } from '../../core/validation.js';
import { quoteMssqlIdentifier } from '../../store/mssql/mssql.identifiers.js';
import {
  mssqlMigrationLock,
  mssqlMigrationLockResource,
  mssqlRuntimeGrants,
} from '../../store/mssql/mssql.migrations.js';
import {
  BROKER_EVENT,
  BROKER_SYSTEM,
  brokerObjectText,
  brokerStringLiteral,
  quoteBrokerObject,
} from '../broker.names.js';
import type {
  BrokerDriver,
  BrokerObjectName,
  BrokerParams,
  BrokerRow,
  BrokerSetupMode,
  ResolvedBrokerOptions,
  ResolvedBrokerQueue,
} from '../broker.types.js';

// Everything about the existence of the Service Broker objects: the DDL that creates them (run
// at boot with setup 'auto', printed for a DBA otherwise), the least-privilege grants, the one
// query boot reads them with, and the pure rules that turn what it saw into what to do.

/** The sender's tables in the module schema (migration 6), for the grants script. */
const BROKER_TABLES = {
  dialogs: 'BrokerDialogs',
  outbox: 'BrokerOutbox',
} as const;

/**
 * POISON_MESSAGE_HANDLING OFF: Service Broker's own poison handling disables a queue after five
 * rolled-back receives, from any session and for any cause, and the disable then waits for an
 * exclusive schema lock that stops every reader and sender of the queue behind it. Our receivers
 * never roll back a receive for a message's sake (a message becomes a job whatever it holds;
 * the table queue retries and dead-letters failing ones), so the only rollbacks left are a
 * doomed transaction or a lost connection, after which the messages should simply be received
 * again. That is what the option is for: "Do not disable automatic poison message handling
 * unless the application using the queue has the logic to handle poison messages"
 * (ServiceQueue.IsPoisonMessageHandlingEnabled, SMO); the table queue is that logic.
 */
const QUEUE_OPTIONS = 'WITH STATUS = ON, RETENTION = OFF, POISON_MESSAGE_HANDLING (STATUS = OFF)';

/** Needs exclusive access to the database: never part of a script, run only on request. */
export function brokerEnableStatement(): string {
  return 'ALTER DATABASE CURRENT SET ENABLE_BROKER WITH ROLLBACK IMMEDIATE;';
}

// ---- DDL, one function per statement

function schemaBatch(schema: string): string {
  // CREATE SCHEMA must be alone in its batch, hence the dynamic SQL; the name is validated.
  return `IF SCHEMA_ID(${brokerStringLiteral(schema)}) IS NULL EXEC (N'CREATE SCHEMA ${quoteMssqlIdentifier(schema)};');`;
}

function messageTypeBatch(name: string, validation: 'NONE' | 'WELL_FORMED_XML'): string {
  return `IF NOT EXISTS (SELECT 1 FROM sys.service_message_types WHERE name = ${brokerStringLiteral(name)})
  CREATE MESSAGE TYPE ${quoteMssqlIdentifier(name)} VALIDATION = ${validation};`;
}

function contractBatch(queue: ResolvedBrokerQueue): string {
  // Only the initiator sends our types; EndDialog and Error need no listing in a contract.
  return `IF NOT EXISTS (SELECT 1 FROM sys.service_contracts WHERE name = ${brokerStringLiteral(queue.contract)})
  CREATE CONTRACT ${quoteMssqlIdentifier(queue.contract)} (${quoteMssqlIdentifier(queue.messageType)} SENT BY INITIATOR, ${quoteMssqlIdentifier(queue.closeMessageType)} SENT BY INITIATOR);`;
}

function queueExists(queue: BrokerObjectName): string {
  return `SELECT 1 FROM sys.service_queues WHERE schema_id = SCHEMA_ID(${brokerStringLiteral(queue.schema)}) AND name = ${brokerStringLiteral(queue.name)}`;
}

function queueBatch(queue: BrokerObjectName): string {
  return `IF NOT EXISTS (${queueExists(queue)})
  CREATE QUEUE ${quoteBrokerObject(queue)} ${QUEUE_OPTIONS};`;
}

/** `contract` absent: a service that only initiates (CREATE SERVICE lists the contracts it is a target of). */
function serviceBatch(service: string, queue: BrokerObjectName, contract?: string): string {
  const contracts = contract === undefined ? '' : ` (${quoteMssqlIdentifier(contract)})`;
  return `IF NOT EXISTS (SELECT 1 FROM sys.services WHERE name = ${brokerStringLiteral(service)})
  CREATE SERVICE ${quoteMssqlIdentifier(service)} ON QUEUE ${quoteBrokerObject(queue)}${contracts};`;
}

function notificationExists(queue: BrokerObjectName, name: string): string {
  return `SELECT 1 FROM sys.event_notifications WHERE parent_id = OBJECT_ID(${brokerStringLiteral(quoteBrokerObject(queue))}) AND name = ${brokerStringLiteral(name)}`;
}

function createNotification(queue: BrokerObjectName, name: string, event: string, service: string): string {
  return `CREATE EVENT NOTIFICATION ${quoteMssqlIdentifier(name)} ON QUEUE ${quoteBrokerObject(queue)} FOR ${event} TO SERVICE ${brokerStringLiteral(service)}, N'current database';`;
}

function queueNotifications(queue: ResolvedBrokerQueue): [name: string, event: string][] {
  // The doorbell's listener always waits in RECEIVE: it needs no activation, and notifications
  // nobody reads would pile up in the notification queue of a process without broker queues.
  if (queue.doorbell) return [];
  return [
    [queue.activationNotification, BROKER_EVENT.QUEUE_ACTIVATION],
    [queue.disabledNotification, BROKER_EVENT.BROKER_QUEUE_DISABLED],
  ];
}

function notificationBatch(queue: ResolvedBrokerQueue, name: string, event: string, service: string): string {
  // BEGIN … END: each statement inside starts after a statement boundary.
  return `IF NOT EXISTS (${notificationExists(queue.queue, name)})
BEGIN
  ${createNotification(queue.queue, name, event, service)}
END;`;
}

/**
 * Drops and creates both event notifications of a broker queue (QUEUE_ACTIVATION and
 * BROKER_QUEUE_DISABLED, to the notification service). The activation listener runs it when a
 * notification was lost: the broker drops an event notification whose dialog broke, and an
 * Error or EndDialog on the notification queue does not say which one it was. Needs ALTER on
 * the queue.
 */
export function brokerEventNotificationBatch(queue: ResolvedBrokerQueue, options: ResolvedBrokerOptions): string {
  return queueNotifications(queue)
    .map(
      ([name, event]) => `IF EXISTS (${notificationExists(queue.queue, name)})
BEGIN
  DROP EVENT NOTIFICATION ${quoteMssqlIdentifier(name)} ON QUEUE ${quoteBrokerObject(queue.queue)};
END;
${createNotification(queue.queue, name, event, options.notificationService)}`,
    )
    .join('\n');
}

/** `ALTER QUEUE … WITH STATUS = ON`: what re-enables a queue that poison detection turned off. */
export function brokerEnableQueueStatement(queue: BrokerObjectName): string {
  return `ALTER QUEUE ${quoteBrokerObject(queue)} WITH STATUS = ON;`;
}

function distinct<T>(items: readonly T[]): T[] {
  return [...new Set(items)];
}

/**
 * The setup as separate batches, each safe to run again (every CREATE is skipped when its object
 * exists): schemas, message types, contracts, queues (target, initiator, notification), services,
 * then the event notifications on each target queue. Run them one by one, in order; with
 * brokerSetupLock first when they run in one transaction.
 */
export function brokerSetupBatches(options: ResolvedBrokerOptions): string[] {
  const qs = brokerSetupQueues(options);
  const allQueues = [...qs.flatMap((q) => [q.queue, q.initiatorQueue]), options.notificationQueue];
  const messageTypes = new Map<string, 'NONE' | 'WELL_FORMED_XML'>();
  for (const q of qs) {
    // broker.options rejects one message type with two validations.
    messageTypes.set(q.messageType, q.format === 'xml' ? 'WELL_FORMED_XML' : 'NONE');
    // The close message has no body worth validating; NONE accepts an empty one as well as NULL.
    messageTypes.set(q.closeMessageType, 'NONE');
  }
  const contracts = new Map(qs.map((q) => [q.contract, q]));
  return [
    ...distinct(allQueues.map((q) => q.schema)).map(schemaBatch),
    ...[...messageTypes].map(([name, validation]) => messageTypeBatch(name, validation)),
    ...[...contracts.values()].map(contractBatch),
    ...allQueues.map(queueBatch),
    serviceBatch(options.notificationService, options.notificationQueue, BROKER_SYSTEM.POST_EVENT_NOTIFICATION),
    ...qs.flatMap((q) => [
      serviceBatch(q.service, q.queue, q.contract),
      serviceBatch(q.initiatorService, q.initiatorQueue),
    ]),
    ...qs.flatMap((q) =>
      queueNotifications(q).map(([name, event]) => notificationBatch(q, name, event, options.notificationService)),
    ),
  ];
}

/**
 * The lock setup 'auto' holds while it runs brokerSetupBatches: the schema migration lock
 * (sp_getapplock, owned by the transaction), so processes booting at once create each object once.
 */
export function brokerSetupLock(schema: string): { text: string; params: BrokerParams } {
  return {
    text: mssqlMigrationLock(),
    params: {
      resource: { type: 'nvarchar', value: mssqlMigrationLockResource(schema) },
      timeoutMs: { type: 'int', value: 60_000 },
    },
  };
}

/**
 * Runs setup batches in one transaction under brokerSetupLock; on any error it rolls back and
 * rethrows. `enableBroker` first runs brokerEnableStatement on its own (ALTER DATABASE cannot
 * run inside a transaction).
 */
export async function applyBrokerSetup(
  driver: BrokerDriver,
  options: ResolvedBrokerOptions,
  plan: { enableBroker: boolean; batches: readonly string[] },
): Promise<void> {
  if (plan.enableBroker) await driver.query(brokerEnableStatement());
  if (plan.batches.length === 0) return;
  const session = await driver.begin();
  try {
    const lock = brokerSetupLock(options.schema);
    await session.query(lock.text, lock.params);
    for (const batch of plan.batches) await session.query(batch);
  } catch (error) {
    await session.rollback().catch(() => undefined);
    throw error;
  }
  await session.commit();
}

/**
 * The whole setup as a script for a DBA (sqlcmd, SSMS): brokerSetupBatches separated by GO,
 * every one safe to run again. Enabling Service Broker is printed as a comment only: it needs
 * exclusive access to the database.
 */
export function brokerSetupScript(options: ResolvedBrokerOptions): string {
  const names = options.queues.map((q) => q.name).join(', ') || 'none';
  const out = [
    `-- nestjs-sql-queue Service Broker objects, schema ${options.schema}, broker queues: ${names}${options.doorbell ? ', and the table-queue doorbell' : ''}`,
    '-- Safe to run again: each CREATE is skipped when its object exists. Run with `sqlcmd -b -i <this file>`.',
    '-- Service Broker must be enabled in the database. That needs exclusive access (it rolls back',
    "-- other sessions' transactions), so this script does not do it. If",
    '--   SELECT is_broker_enabled FROM sys.databases WHERE database_id = DB_ID();',
    '-- returns 0, run this when nothing else uses the database:',
    `-- ${brokerEnableStatement()}`,
    'SET XACT_ABORT ON;',
    'GO',
  ];
  for (const batch of brokerSetupBatches(options)) out.push(batch, 'GO');
  return `${out.join('\n')}\n`;
}

/**
 * Drops every object brokerSetupBatches creates, in an order SQL Server accepts: event
 * notifications, services, queues, contracts, message types; schemas stay. For tests and
 * uninstalling. The notification queue and service are shared by every broker queue of the
 * module schema: drop them only with all of them.
 */
export function brokerTeardownBatches(options: ResolvedBrokerOptions): string[] {
  const qs = brokerSetupQueues(options);
  const dropIf = (exists: string, drop: string) => `IF EXISTS (${exists})\n  ${drop}`;
  return [
    ...qs.flatMap((q) =>
      queueNotifications(q).map(
        ([name]) => `IF EXISTS (${notificationExists(q.queue, name)})
BEGIN
  DROP EVENT NOTIFICATION ${quoteMssqlIdentifier(name)} ON QUEUE ${quoteBrokerObject(q.queue)};
END;`,
      ),
    ),
    ...[...qs.flatMap((q) => [q.service, q.initiatorService]), options.notificationService].map((service) =>
      dropIf(
        `SELECT 1 FROM sys.services WHERE name = ${brokerStringLiteral(service)}`,
        `DROP SERVICE ${quoteMssqlIdentifier(service)};`,
      ),
    ),
    ...[...qs.flatMap((q) => [q.queue, q.initiatorQueue]), options.notificationQueue].map((queue) =>
      dropIf(queueExists(queue), `DROP QUEUE ${quoteBrokerObject(queue)};`),
    ),
    ...distinct(qs.map((q) => q.contract)).map((contract) =>
      dropIf(
        `SELECT 1 FROM sys.service_contracts WHERE name = ${brokerStringLiteral(contract)}`,
        `DROP CONTRACT ${quoteMssqlIdentifier(contract)};`,
      ),
    ),
    ...distinct(qs.flatMap((q) => [q.messageType, q.closeMessageType])).map((type) =>
      dropIf(
        `SELECT 1 FROM sys.service_message_types WHERE name = ${brokerStringLiteral(type)}`,
        `DROP MESSAGE TYPE ${quoteMssqlIdentifier(type)};`,
      ),
    ),
  ];
}

// ---- Grants

/** Database principals the grants script is written for; each is optional. */
export interface BrokerGrantees {
  /** The login of consuming processes: readers, the activation listener, boot and health checks. */
  readers?: string;
  /** The login of processes that send. */
  senders?: string;
  /** Whoever repairs queues and event notifications and manages dead messages. */
  admin?: string;
}

function assertPrincipal(role: string, value: unknown): string {
  return quoteMssqlIdentifier(assertPrincipalName(role, value));
}

/**
 * Least-privilege GRANT statements for the broker queues, per role (a role left out gets none):
 * - readers: RECEIVE on the target and notification queues, VIEW DEFINITION on the notification
 *   service, database-wide VIEW DEFINITION (catalog views show only objects a principal holds a
 *   permission on, and an event notification takes no grant of its own), and the table queue's
 *   runtime grants (receivers enqueue what they receive; mssqlRuntimeGrants).
 * - senders: SEND on the target services, RECEIVE on the initiator queues (a dialog begins FROM
 *   the initiator service, and EndDialog and Error come back there), REFERENCES on contracts and
 *   message types, SELECT/INSERT/UPDATE/DELETE on BrokerDialogs and BrokerOutbox, VIEW DEFINITION;
 *   with the doorbell, RECEIVE on its queue too (a ring reads it first; that reading a queue
 *   needs RECEIVE is our assumption, which the live least-privilege test checks); and the table
 *   queue's runtime grants (every process of the module runs the reaper and retention).
 * - admin: ALTER on the target queues (re-enabling a queue, recreating its event notifications)
 *   and SELECT/INSERT/UPDATE/DELETE on the sender's tables. Dead messages are dead jobs: retrying
 *   and purging them needs the runtime grants only.
 * VIEW SERVER STATE (VIEW SERVER PERFORMANCE STATE from SQL Server 2022) is not granted: the
 * broker health reading then says it could not read the lock manager, and reports the rest.
 * The live least-privilege test (test:mssql) is what proves the set sufficient.
 */
export function brokerGrantsScript(options: ResolvedBrokerOptions, grantees: BrokerGrantees): string {
  const s = quoteMssqlIdentifier(options.schema);
  const qs = brokerSetupQueues(options);
  const table = (name: string) => `${s}.${quoteMssqlIdentifier(name)}`;
  const dml = (name: string, to: string) => `GRANT SELECT, INSERT, UPDATE, DELETE ON ${table(name)} TO ${to};`;
  const out: string[] = [
    `-- nestjs-sql-queue Service Broker grants, schema ${options.schema}, broker queues: ${qs.map((q) => q.name).join(', ')}`,
  ];
  if (grantees.readers !== undefined) {
    const to = assertPrincipal('readers', grantees.readers);
    out.push(
      `-- readers: ${grantees.readers}`,
      ...qs.map((q) => `GRANT RECEIVE ON ${quoteBrokerObject(q.queue)} TO ${to};`),
      `GRANT RECEIVE ON ${quoteBrokerObject(options.notificationQueue)} TO ${to};`,
      `GRANT VIEW DEFINITION ON SERVICE::${quoteMssqlIdentifier(options.notificationService)} TO ${to};`,
      `GRANT VIEW DEFINITION TO ${to};`,
      ...mssqlRuntimeGrants(options.schema, to),
    );
  }
  if (grantees.senders !== undefined) {
    const to = assertPrincipal('senders', grantees.senders);
    out.push(
      `-- senders: ${grantees.senders}`,
      ...qs.flatMap((q) => [
        `GRANT SEND ON SERVICE::${quoteMssqlIdentifier(q.service)} TO ${to};`,
        `GRANT RECEIVE ON ${quoteBrokerObject(q.initiatorQueue)} TO ${to};`,
      ]),
      ...distinct(qs.map((q) => q.contract)).map(
        (c) => `GRANT REFERENCES ON CONTRACT::${quoteMssqlIdentifier(c)} TO ${to};`,
      ),
      ...distinct(qs.flatMap((q) => [q.messageType, q.closeMessageType])).map(
        (m) => `GRANT REFERENCES ON MESSAGE TYPE::${quoteMssqlIdentifier(m)} TO ${to};`,
      ),
      // A ring first looks (SELECT … WITH (NOLOCK)) for a ring already waiting in the doorbell queue.
      ...(options.doorbell ? [`GRANT RECEIVE ON ${quoteBrokerObject(options.doorbell.queue)} TO ${to};`] : []),
      dml(BROKER_TABLES.dialogs, to),
      dml(BROKER_TABLES.outbox, to),
      `GRANT VIEW DEFINITION TO ${to};`,
      ...mssqlRuntimeGrants(options.schema, to),
    );
  }
  if (grantees.admin !== undefined) {
    const to = assertPrincipal('admin', grantees.admin);
    out.push(
      `-- admin: ${grantees.admin}`,
      ...qs.map((q) => `GRANT ALTER ON ${quoteBrokerObject(q.queue)} TO ${to};`),
      ...Object.values(BROKER_TABLES).map((name) => dml(name, to)),
    );
  }
  out.push('GO');
  return `${out.join('\n')}\n`;
}

// ---- Boot check: one query, then pure rules

/**
 * One batch reading everything boot needs, as one result set (the driver returns the last one):
 * a row for the database (is_broker_enabled) and one per object the options name, present or
 * not. Names are bound parameters (@p0, @p1, …).
 */
export function brokerObservationQuery(options: ResolvedBrokerOptions): { text: string; params: BrokerParams } {
  const params: BrokerParams = {};
  let n = 0;
  const p = (value: string) => {
    const name = `p${n++}`;
    params[name] = { type: 'nvarchar', value };
    return `@${name}`;
  };
  const qs = brokerSetupQueues(options);
  const messageTypes = distinct(qs.flatMap((q) => [q.messageType, q.closeMessageType]));
  const contracts = distinct(qs.map((q) => q.contract));
  const queues = [...qs.flatMap((q) => [q.queue, q.initiatorQueue]), options.notificationQueue];
  const services: [string, string | null][] = [
    ...qs.flatMap((q): [string, string | null][] => [
      [q.service, q.contract],
      [q.initiatorService, null],
    ]),
    [options.notificationService, BROKER_SYSTEM.POST_EVENT_NOTIFICATION],
  ];
  const notifications = qs.flatMap((q) => queueNotifications(q).map(([name]) => [q.queue, name] as const));
  const rows = (items: string[][]) => items.map((values) => `(${values.join(', ')})`).join(', ');

  const text = `SELECT CAST(N'database' AS nvarchar(20)) AS [Kind], CAST(NULL AS sysname) AS [Schema], CAST(DB_NAME() AS sysname) AS [Name],
  CAST(NULL AS sysname) AS [Parent], CAST(1 AS bit) AS [Present], d.is_broker_enabled AS [BrokerEnabled],
  CAST(NULL AS bit) AS [ReceiveEnabled], CAST(NULL AS bit) AS [EnqueueEnabled], CAST(NULL AS bit) AS [ActivationEnabled],
  CAST(NULL AS nvarchar(776)) AS [ActivationProcedure], CAST(NULL AS bit) AS [PoisonHandling],
  CAST(NULL AS nvarchar(60)) AS [Validation], CAST(NULL AS nvarchar(300)) AS [OnQueue], CAST(NULL AS bit) AS [HasContract],
  CAST(NULL AS nvarchar(256)) AS [TargetService]
FROM sys.databases AS d
WHERE d.database_id = DB_ID()
UNION ALL
SELECT N'messageType', NULL, w.[Name], NULL, CASE WHEN mt.message_type_id IS NULL THEN 0 ELSE 1 END, NULL,
  NULL, NULL, NULL, NULL, NULL, mt.validation_desc, NULL, NULL, NULL
FROM (VALUES ${rows(messageTypes.map((m) => [p(m)]))}) AS w([Name])
LEFT JOIN sys.service_message_types AS mt ON mt.name = w.[Name]
UNION ALL
SELECT N'contract', NULL, w.[Name], NULL, CASE WHEN c.service_contract_id IS NULL THEN 0 ELSE 1 END, NULL,
  NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
FROM (VALUES ${rows(contracts.map((c) => [p(c)]))}) AS w([Name])
LEFT JOIN sys.service_contracts AS c ON c.name = w.[Name]
UNION ALL
SELECT N'queue', w.[Schema], w.[Name], NULL, CASE WHEN q.object_id IS NULL THEN 0 ELSE 1 END, NULL,
  q.is_receive_enabled, q.is_enqueue_enabled, q.is_activation_enabled, q.activation_procedure,
  q.is_poison_message_handling_enabled, NULL, NULL, NULL, NULL
FROM (VALUES ${rows(queues.map((q) => [p(q.schema), p(q.name)]))}) AS w([Schema], [Name])
LEFT JOIN sys.service_queues AS q ON q.schema_id = SCHEMA_ID(w.[Schema]) AND q.name = w.[Name]
UNION ALL
SELECT N'service', NULL, w.[Name], NULL, CASE WHEN s.service_id IS NULL THEN 0 ELSE 1 END, NULL,
  NULL, NULL, NULL, NULL, NULL, NULL, SCHEMA_NAME(sq.schema_id) + N'.' + sq.name,
  CASE WHEN w.[Contract] IS NULL THEN NULL
    WHEN EXISTS (
      SELECT 1 FROM sys.service_contract_usages AS u
      JOIN sys.service_contracts AS c ON c.service_contract_id = u.service_contract_id
      WHERE u.service_id = s.service_id AND c.name = w.[Contract]
    ) THEN 1 ELSE 0 END,
  NULL
FROM (VALUES ${rows(services.map(([name, contract]) => [p(name), contract === null ? 'NULL' : p(contract)]))}) AS w([Name], [Contract])
LEFT JOIN sys.services AS s ON s.name = w.[Name]
LEFT JOIN sys.service_queues AS sq ON sq.object_id = s.service_queue_id
UNION ALL
SELECT N'eventNotification', w.[Schema], w.[Name], w.[Queue], CASE WHEN en.object_id IS NULL THEN 0 ELSE 1 END, NULL,
  NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, en.service_name
FROM (VALUES ${rows(notifications.map(([queue, name]) => [p(queue.schema), p(queue.name), p(name)]))}) AS w([Schema], [Queue], [Name])
LEFT JOIN sys.event_notifications AS en
  ON en.parent_id = OBJECT_ID(QUOTENAME(w.[Schema]) + N'.' + QUOTENAME(w.[Queue])) AND en.name = w.[Name];`;
  return { text, params };
}

export interface ObservedBrokerQueue {
  receiveEnabled: boolean;
  enqueueEnabled: boolean;
  activationEnabled: boolean;
  activationProcedure: string | null;
  poisonHandling: boolean;
}

export interface ObservedBrokerService {
  /** 'schema.name' of the queue it is on. */
  queue: string | null;
  /** Whether it lists the contract we asked about (null: we asked about none). */
  hasContract: boolean | null;
}

/** What brokerObservationQuery saw; only objects that exist are in the maps. */
export interface BrokerObservation {
  database: string;
  brokerEnabled: boolean;
  /** Message type → validation_desc (NONE, EMPTY, XML, …). */
  messageTypes: Map<string, string>;
  contracts: Set<string>;
  /** Key: 'schema.name'. */
  queues: Map<string, ObservedBrokerQueue>;
  services: Map<string, ObservedBrokerService>;
  /** Key: brokerNotificationKey(queue, name); value: the service it sends to. */
  eventNotifications: Map<string, string>;
}

export function brokerNotificationKey(queue: BrokerObjectName, name: string): string {
  return `${brokerObjectText(queue)}/${name}`;
}

const bit = (value: unknown): boolean => value === true || value === 1;
const text = (value: unknown): string | null => (typeof value === 'string' ? value : null);

/** Turns the rows of brokerObservationQuery into a BrokerObservation. */
export function parseBrokerObservation(rows: readonly BrokerRow[]): BrokerObservation {
  const observed: BrokerObservation = {
    database: '',
    brokerEnabled: false,
    messageTypes: new Map(),
    contracts: new Set(),
    queues: new Map(),
    services: new Map(),
    eventNotifications: new Map(),
  };
  for (const row of rows) {
    const name = String(row.Name);
    if (row.Kind === 'database') {
      observed.database = name;
      observed.brokerEnabled = bit(row.BrokerEnabled);
      continue;
    }
    if (!bit(row.Present)) continue;
    const object = { schema: String(row.Schema), name };
    switch (row.Kind) {
      case 'messageType':
        observed.messageTypes.set(name, text(row.Validation) ?? '');
        break;
      case 'contract':
        observed.contracts.add(name);
        break;
      case 'queue':
        observed.queues.set(brokerObjectText(object), {
          receiveEnabled: bit(row.ReceiveEnabled),
          enqueueEnabled: bit(row.EnqueueEnabled),
          activationEnabled: bit(row.ActivationEnabled),
          activationProcedure: text(row.ActivationProcedure) || null,
          poisonHandling: bit(row.PoisonHandling),
        });
        break;
      case 'service':
        observed.services.set(name, {
          queue: text(row.OnQueue),
          hasContract: row.HasContract === null || row.HasContract === undefined ? null : bit(row.HasContract),
        });
        break;
      case 'eventNotification':
        observed.eventNotifications.set(
          brokerNotificationKey({ schema: String(row.Schema), name: String(row.Parent) }, name),
          text(row.TargetService) ?? '',
        );
        break;
    }
  }
  return observed;
}

export type BrokerProblemKind =
  | 'broker-disabled'
  | 'queue-disabled'
  | 'internal-activation'
  | 'poison-handling-on'
  | 'service-queue'
  | 'service-contract'
  | 'message-type-validation'
  | 'notification-target';

export interface BrokerSetupProblem {
  kind: BrokerProblemKind;
  /** 'warning' never stops boot. */
  severity: 'error' | 'warning';
  message: string;
  /** What a person does about it (a statement, or which option to change). */
  fix: string;
  /** The batch setup 'auto' runs to repair it; absent when a person must decide. */
  repair?: string;
}

export interface BrokerSetupAssessment {
  database: string;
  brokerEnabled: boolean;
  /** Objects that do not exist (or that this login cannot see), e.g. "queue [s].[q]". */
  missing: string[];
  problems: BrokerSetupProblem[];
}

/** Compares what exists with what the options need. */
export function assessBrokerSetup(observed: BrokerObservation, options: ResolvedBrokerOptions): BrokerSetupAssessment {
  const missing: string[] = [];
  const problems: BrokerSetupProblem[] = [];
  const db = observed.database;
  if (!observed.brokerEnabled) {
    problems.push({
      kind: 'broker-disabled',
      severity: 'error',
      message: `Service Broker is disabled in database '${db}'`,
      fix: `run ALTER DATABASE ${quoteMssqlIdentifier(db)} SET ENABLE_BROKER WITH ROLLBACK IMMEDIATE (needs exclusive access; a restored copy of a database whose broker still runs elsewhere needs SET NEW_BROKER instead), or set broker.enableBroker: true with broker.setup 'auto'`,
    });
  }
  const qs = brokerSetupQueues(options);
  // Message types and contracts may be shared by broker queues: check each once.
  const seen = new Set<string>();
  const once = (key: string) => {
    if (seen.has(key)) return false;
    seen.add(key);
    return true;
  };

  for (const q of qs) {
    for (const [type, xml] of [
      [q.messageType, q.format === 'xml'],
      [q.closeMessageType, false],
    ] as const) {
      if (!once(`mt:${type}`)) continue;
      const validation = observed.messageTypes.get(type);
      if (validation === undefined) missing.push(`message type ${quoteMssqlIdentifier(type)}`);
      else if (validation === 'EMPTY' || (!xml && validation !== 'NONE')) {
        problems.push({
          kind: 'message-type-validation',
          severity: 'error',
          message: `message type ${quoteMssqlIdentifier(type)} has VALIDATION ${validation}, which refuses the bodies broker queue '${q.name}' sends`,
          fix: `use a message type with VALIDATION = ${xml ? 'WELL_FORMED_XML or NONE' : 'NONE'}: set broker.queues['${q.name}'].${type === q.messageType ? 'messageType' : 'closeMessageType'} to another name`,
        });
      }
    }
    if (once(`c:${q.contract}`) && !observed.contracts.has(q.contract)) {
      missing.push(`contract ${quoteMssqlIdentifier(q.contract)}`);
    }
  }

  const checkQueue = (queue: BrokerObjectName, target: boolean) => {
    const found = observed.queues.get(brokerObjectText(queue));
    const quoted = quoteBrokerObject(queue);
    if (!found) {
      missing.push(`queue ${quoted}`);
      return;
    }
    if (!found.receiveEnabled || !found.enqueueEnabled) {
      const statement = brokerEnableQueueStatement(queue);
      problems.push({
        kind: 'queue-disabled',
        severity: 'error',
        message: `queue ${quoted} is disabled (STATUS = OFF; Service Broker turns a queue off after five rolled-back receives in a row)`,
        fix: `run ${statement}`,
        repair: statement,
      });
    }
    if (target && found.activationProcedure) {
      problems.push({
        kind: 'internal-activation',
        severity: 'error',
        message: `queue ${quoted} has an activation procedure (${found.activationProcedure}), which cannot coexist with our QUEUE_ACTIVATION event notification (errors 9717 and 9718)`,
        fix: `run ALTER QUEUE ${quoted} WITH ACTIVATION (DROP); if nothing else relies on that procedure, or give the broker queue a queue of its own`,
      });
    }
    if (found.poisonHandling) {
      problems.push({
        kind: 'poison-handling-on',
        severity: 'warning',
        message: `queue ${quoted} has POISON_MESSAGE_HANDLING (STATUS = ON): five rolled-back receives by any session (a crash, a deadlock victim, someone inspecting a message in a transaction) disable it, and until the disable gets its schema lock every reader and sender of the queue waits; failing messages are dead-lettered by the table queue instead`,
        fix: `run ALTER QUEUE ${quoted} WITH POISON_MESSAGE_HANDLING (STATUS = OFF);`,
      });
    }
  };
  for (const q of qs) {
    checkQueue(q.queue, true);
    checkQueue(q.initiatorQueue, false);
  }
  checkQueue(options.notificationQueue, false);

  const checkService = (service: string, queue: BrokerObjectName, contract: string | null, option: string | null) => {
    const found = observed.services.get(service);
    const quoted = quoteMssqlIdentifier(service);
    const other =
      option === null ? 'or drop the service so that the setup creates it' : `or set ${option} to a service of its own`;
    if (!found) {
      missing.push(`service ${quoted}`);
      return;
    }
    if (found.queue !== null && found.queue.toLowerCase() !== brokerObjectText(queue).toLowerCase()) {
      problems.push({
        kind: 'service-queue',
        severity: 'error',
        message: `service ${quoted} is on queue ${found.queue}, not on ${quoteBrokerObject(queue)}`,
        fix: `run ALTER SERVICE ${quoted} ON QUEUE ${quoteBrokerObject(queue)}; ${other}`,
      });
    }
    if (contract !== null && found.hasContract === false) {
      problems.push({
        kind: 'service-contract',
        severity: 'error',
        message: `service ${quoted} does not accept contract ${quoteMssqlIdentifier(contract)}`,
        fix: `run ALTER SERVICE ${quoted} (ADD CONTRACT ${quoteMssqlIdentifier(contract)}); ${other}`,
      });
    }
  };
  for (const q of qs) {
    const where = `broker.queues['${q.name}']`;
    checkService(q.service, q.queue, q.contract, `${where}.service`);
    checkService(q.initiatorService, q.initiatorQueue, null, `${where}.initiatorService`);
  }
  checkService(options.notificationService, options.notificationQueue, BROKER_SYSTEM.POST_EVENT_NOTIFICATION, null);

  for (const q of qs) {
    for (const [name] of queueNotifications(q)) {
      const target = observed.eventNotifications.get(brokerNotificationKey(q.queue, name));
      const quoted = `event notification ${quoteMssqlIdentifier(name)} on queue ${quoteBrokerObject(q.queue)}`;
      if (target === undefined) {
        // A missing queue is reported already; its notifications come with it.
        if (observed.queues.has(brokerObjectText(q.queue))) missing.push(quoted);
      } else if (target !== options.notificationService) {
        problems.push({
          kind: 'notification-target',
          severity: 'error',
          message: `${quoted} sends to service '${target}', not to '${options.notificationService}'`,
          fix: `drop it (DROP EVENT NOTIFICATION ${quoteMssqlIdentifier(name)} ON QUEUE ${quoteBrokerObject(q.queue)};) and run the setup script, or use broker.setup 'auto'`,
          repair: brokerEventNotificationBatch(q, options),
        });
      }
    }
  }
  return { database: db, brokerEnabled: observed.brokerEnabled, missing, problems };
}

export type BrokerBootDecision =
  /** Nothing to do; log the warnings. */
  | { action: 'ok'; warnings: string[] }
  /** Run applyBrokerSetup with this plan, log the warnings, then observe and decide again (secondPass). */
  | { action: 'setup'; enableBroker: boolean; batches: string[]; warnings: string[] }
  /** Boot fails with this message; `script` (setup 'print') is the setup script to log with it. */
  | { action: 'fail'; message: string; script: string | null; warnings: string[] };

/**
 * What boot does about an assessment, per broker.setup:
 * - 'auto' creates what is missing (the whole idempotent setup), re-enables disabled queues and
 *   recreates misdirected event notifications, with a warning for each repair; a disabled
 *   broker is enabled only with enableBroker.
 * - 'print' fails, with the setup script to log; 'off' fails naming what is missing.
 * Problems no statement of ours should fix (a service on another queue, an activation
 * procedure) fail in every mode. `secondPass`: the assessment after a setup run; anything left
 * then fails instead of running the setup again.
 */
export function brokerBootDecision(
  assessment: BrokerSetupAssessment,
  options: ResolvedBrokerOptions,
  secondPass = false,
): BrokerBootDecision {
  const setup: BrokerSetupMode = options.setup;
  const warnings = assessment.problems.filter((p) => p.severity === 'warning').map((p) => `${p.message}: ${p.fix}`);
  const errors = assessment.problems.filter((p) => p.severity === 'error');
  const describeAll = (problems: BrokerSetupProblem[], missing: string[]) =>
    [
      ...problems.map((p) => `${p.message}: ${p.fix}`),
      ...(missing.length > 0 ? [`missing: ${missing.join(', ')}`] : []),
    ].join('; ');
  const brokerOff = errors.find((p) => p.kind === 'broker-disabled');
  const manual = errors.filter((p) => p.kind !== 'broker-disabled' && p.repair === undefined);
  const repairable = errors.filter((p) => p.repair !== undefined);

  if (errors.length === 0 && assessment.missing.length === 0) return { action: 'ok', warnings };

  const enableBroker = brokerOff !== undefined && setup === 'auto' && options.enableBroker && !secondPass;
  const blocking = [...manual, ...(brokerOff && !enableBroker ? [brokerOff] : [])];
  if (setup === 'auto' && !secondPass && blocking.length === 0) {
    return {
      action: 'setup',
      enableBroker,
      batches: [
        ...(assessment.missing.length > 0 ? brokerSetupBatches(options) : []),
        ...repairable.map((p) => p.repair!),
      ],
      warnings: [
        ...warnings,
        ...(enableBroker
          ? [`Service Broker is disabled in database '${assessment.database}': enabling it (broker.enableBroker)`]
          : []),
        ...repairable.map((p) => `${p.message}: running ${p.repair!.includes('\n') ? 'its repair' : p.repair}`),
      ],
    };
  }

  const all = setup === 'auto' && !secondPass ? blocking : errors;
  const prefix = secondPass ? 'Service Broker setup did not complete' : 'Service Broker setup is incomplete';
  const hint =
    setup === 'off'
      ? ` (broker.setup is 'off': have a DBA run the script from \`nestjs-sql-queue sql --dialect mssql --schema ${options.schema} --broker-only --broker-config <file.json>\` (or --broker <name> per queue), or set broker.setup to 'auto')`
      : setup === 'print'
        ? " (broker.setup is 'print': the setup script is logged below; run it, or set broker.setup to 'auto')"
        : '';
  return {
    action: 'fail',
    message: `${prefix} in database '${assessment.database}': ${describeAll(all, setup === 'auto' && !secondPass ? [] : assessment.missing)}${hint}`,
    script: setup === 'print' ? brokerSetupScript(options) : null,
    warnings,
  };
}
