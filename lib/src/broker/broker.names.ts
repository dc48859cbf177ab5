import { SqlQueueConfigError } from '../core/errors.js';
import { describe } from '../core/validation.js';
import { quoteMssqlIdentifier } from '../store/mssql/mssql.identifiers.js';
import type { BrokerObjectName } from './broker.types.js';

// Service Broker names: the system ones (constants, exact strings) and ours (validated, derived
// from the module schema and the broker queue's name).

/**
 * System message types and contracts. They are spelled with `http://`: several Microsoft Learn
 * pages show `https://` (a link rewrite), and that spelling names nothing: a statement using it
 * fails, a comparison with it never matches. Unit-tested character for character.
 */
export const BROKER_SYSTEM = {
  /** Sent by the other side when it ends the conversation normally. */
  END_DIALOG: 'http://schemas.microsoft.com/SQL/ServiceBroker/EndDialog',
  /** Sent by the other side (or the broker) when the conversation ends with an error. */
  ERROR: 'http://schemas.microsoft.com/SQL/ServiceBroker/Error',
  /** Delivered when a BEGIN CONVERSATION TIMER expires. */
  DIALOG_TIMER: 'http://schemas.microsoft.com/SQL/ServiceBroker/DialogTimer',
  /** The contract a service must honour to receive event notifications. */
  POST_EVENT_NOTIFICATION: 'http://schemas.microsoft.com/SQL/Notifications/PostEventNotification',
  /** The message type of an event notification (QUEUE_ACTIVATION, BROKER_QUEUE_DISABLED). */
  EVENT_NOTIFICATION: 'http://schemas.microsoft.com/SQL/Notifications/EventNotification',
} as const;

/** Event types a queue-scoped event notification may fire for (CREATE EVENT NOTIFICATION ... ON QUEUE). */
export const BROKER_EVENT = {
  QUEUE_ACTIVATION: 'QUEUE_ACTIVATION',
  BROKER_QUEUE_DISABLED: 'BROKER_QUEUE_DISABLED',
} as const;

/**
 * Our event notifications on each target queue. An event notification's name only has to be
 * unique within its scope (here: the queue it is on), so fixed names are enough.
 */
export const BROKER_ACTIVATION_NOTIFICATION = 'sqlqueue_activation';
export const BROKER_DISABLED_NOTIFICATION = 'sqlqueue_disabled';

/** The notification queue of a module schema: `[schema].[BrokerActivationQueue]`. */
export const BROKER_NOTIFICATION_QUEUE = 'BrokerActivationQueue';

/** Prefix of every Service Broker name we derive. */
export const BROKER_NAME_PREFIX = 'nestjs-sql-queue';

/** SQL Server's limit for every name here (sysname; message types, contracts and services alike). */
export const BROKER_NAME_MAX = 128;

// A schema or an object name a user writes: a plain identifier, as for the module schema.
const PLAIN_IDENTIFIER = /^[A-Za-z_][A-Za-z0-9_]{0,127}$/;
// A queue name we derive from a broker queue's name, which may contain '.' and '-'
// (assertQueueName); always bracket-quoted, never parsed back.
const DERIVED_OBJECT = /^[A-Za-z0-9_.-]{1,128}$/;
// Message types, contracts and services: no quotes, brackets or spaces, so a name can be
// bracketed as an identifier and written as an N'…' literal alike.
const BROKER_NAME = /^[A-Za-z0-9_.:/-]{1,128}$/;
// DEFAULT is the system contract and message type; ANY means "every" in CREATE BROKER PRIORITY.
const RESERVED_BROKER_NAMES = new Set(['DEFAULT', 'ANY']);

/** Derived names of one broker queue, before any option overrides them. */
export interface BrokerDefaultNames {
  queue: BrokerObjectName;
  initiatorQueue: BrokerObjectName;
  service: string;
  initiatorService: string;
  contract: string;
  messageType: string;
  closeMessageType: string;
}

/**
 * Names a broker queue gets when its options do not set them, from module schema S and the
 * broker queue's name N:
 * - queue `[S].[N_TargetQueue]`, initiator queue `[S].[N_InitiatorQueue]`;
 * - services `nestjs-sql-queue/S/N/target` and `nestjs-sql-queue/S/N/initiator`;
 * - contract `nestjs-sql-queue/S/N/contract`;
 * - message types `nestjs-sql-queue/S/N/message` and `nestjs-sql-queue/S/N/close`.
 *
 * They are not validated here: resolveBrokerOptions checks each one, so that a name over 128
 * characters fails naming the option to set instead.
 */
export function brokerDefaultNames(schema: string, name: string): BrokerDefaultNames {
  const base = `${BROKER_NAME_PREFIX}/${schema}/${name}`;
  return {
    queue: { schema, name: `${name}_TargetQueue` },
    initiatorQueue: { schema, name: `${name}_InitiatorQueue` },
    service: `${base}/target`,
    initiatorService: `${base}/initiator`,
    contract: `${base}/contract`,
    messageType: `${base}/message`,
    closeMessageType: `${base}/close`,
  };
}

/** The notification queue of module schema S: `[S].[BrokerActivationQueue]`. */
export function brokerNotificationQueue(schema: string): BrokerObjectName {
  return { schema, name: BROKER_NOTIFICATION_QUEUE };
}

/** The notification service of module schema S: `nestjs-sql-queue/S/activation`. */
export function brokerNotificationService(schema: string): string {
  return `${BROKER_NAME_PREFIX}/${schema}/activation`;
}

/**
 * A queue name from the options: 'name' (in the module schema) or 'schema.name', each part a
 * plain identifier (letters, digits, '_'; not starting with a digit). `option` names the
 * option in the error, e.g. broker.queues['orders'].queue.
 */
export function parseBrokerQueueName(option: string, value: unknown, schema: string): BrokerObjectName {
  const parts = typeof value === 'string' ? value.split('.') : [];
  if (parts.length < 1 || parts.length > 2 || !parts.every((part) => PLAIN_IDENTIFIER.test(part))) {
    throw new SqlQueueConfigError(
      `${option} ${describe(value)} is invalid: write 'name' (in schema '${schema}') or 'schema.name', each part starting with a letter or '_', then letters, digits or '_' (max 128 characters)`,
    );
  }
  return parts.length === 2 ? { schema: parts[0]!, name: parts[1]! } : { schema, name: parts[0]! };
}

/**
 * Checks a queue name we derived. Only its length can be wrong (the broker queue's name is a
 * valid queue name already); the message says which option to set instead.
 */
export function assertDerivedQueueName(option: string, name: BrokerObjectName): BrokerObjectName {
  if (!DERIVED_OBJECT.test(name.name)) {
    throw new SqlQueueConfigError(
      `${option}: the default '${name.name}' is longer than ${BROKER_NAME_MAX} characters (or has characters a queue name cannot have): set ${option} explicitly`,
    );
  }
  return name;
}

/**
 * A Service Broker name (service, contract, message type) from the options or derived:
 * 1 to 128 of letters, digits, '_', '.', ':', '/', '-'; not DEFAULT or ANY. `derived` says the
 * value is our default, so the fix is to set the option explicitly.
 */
export function assertBrokerName(option: string, value: unknown, derived = false): string {
  if (typeof value === 'string' && BROKER_NAME.test(value) && !RESERVED_BROKER_NAMES.has(value.toUpperCase())) {
    return value;
  }
  if (derived) {
    throw new SqlQueueConfigError(
      `${option}: the default ${describe(value)} is longer than ${BROKER_NAME_MAX} characters: set ${option} explicitly (a shorter broker queue name or schema also works)`,
    );
  }
  if (typeof value === 'string' && RESERVED_BROKER_NAMES.has(value.toUpperCase())) {
    throw new SqlQueueConfigError(
      `${option} ${describe(value)} is reserved by Service Broker (DEFAULT is the system contract and message type, ANY means every name): choose another name`,
    );
  }
  throw new SqlQueueConfigError(
    `${option} ${describe(value)} is invalid: use letters, digits, '_', '.', ':', '/', '-' (1 to ${BROKER_NAME_MAX} characters; no spaces, quotes or brackets)`,
  );
}

/** `[schema].[name]`, for DDL and statements. */
export function quoteBrokerObject(name: BrokerObjectName): string {
  return `${quoteMssqlIdentifier(name.schema)}.${quoteMssqlIdentifier(name.name)}`;
}

/** `schema.name`, for messages and map keys. */
export function brokerObjectText(name: BrokerObjectName): string {
  return `${name.schema}.${name.name}`;
}

/**
 * A validated name as an N'…' literal, where T-SQL wants a string (TO SERVICE, OBJECT_ID).
 * Our patterns forbid quotes; doubling them anyway keeps the literal correct if that changes.
 */
export function brokerStringLiteral(text: string): string {
  return `N'${text.replace(/'/g, "''")}'`;
}
