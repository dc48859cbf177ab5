import type { BackoffOption, RetryDelay } from '../core/backoff.js';
import type { BrokerDeadReason } from '../core/events.js';

// Service Broker transport: the shapes every part of lib/src/broker/ shares. Nothing here loads
// `mssql` (an optional peer); only broker.mssql-driver.ts does, and it is loaded on demand.

/** How a message body is handed to the handler: parsed JSON, the raw bytes, or XML text. */
export type BrokerBodyFormat = 'json' | 'raw' | 'xml';

/** `auto` creates missing broker objects at boot; `print` logs the script and fails; `off` only checks. */
export type BrokerSetupMode = 'auto' | 'print' | 'off';

/** One broker queue, as a user declares it under `broker.queues[name]`. Every name is optional. */
export interface BrokerQueueOptions {
  /** The Service Broker queue readers receive from: 'name' (in the module schema) or 'schema.name'. */
  queue?: string;
  /** The target service on that queue (the one senders address). */
  service?: string;
  /** The contract of the dialogs. */
  contract?: string;
  /** The message type of the application's messages. */
  messageType?: string;
  /** Our own message type that closes a dialog (the recycle handshake); never handed to a handler. */
  closeMessageType?: string;
  /** The initiator side's queue (EndDialog and Error from the target arrive there). */
  initiatorQueue?: string;
  /** The initiator side's service (dialogs are begun FROM it). */
  initiatorService?: string;
  /** Body format handed to the handler and sent by `send()` (default 'json'). */
  format?: BrokerBodyFormat;
  /** Readers kept running when the queue is idle (default 1). */
  minReaders?: number;
  /** Most readers of this queue in this process; maps to MAX_QUEUE_READERS (default 5). */
  maxReaders?: number;
  /** Handler runs of one message before it is dead-lettered (default 5). */
  maxAttempts?: number;
  /** Delay before a failed message runs again; its group waits meanwhile (default exponential from 1 s, max 1 min). */
  backoff?: BackoffOption;
  /** Messages received and committed per transaction (count-and-commit, default 10). */
  messagesPerTransaction?: number;
  /** Longest a handler may run; then its signal aborts and the attempt fails (default 1 h, null: none). */
  maxDurationMs?: number | null;
}

/** Module option `broker`. */
export interface BrokerOptions {
  /** The broker queues by name (required, unless only the doorbell is wanted). */
  queues?: Record<string, BrokerQueueOptions>;
  /** Default 'auto'. */
  setup?: BrokerSetupMode;
  /**
   * With setup 'auto': run `ALTER DATABASE CURRENT SET ENABLE_BROKER WITH ROLLBACK IMMEDIATE`
   * when the broker is off (it disconnects other sessions; default false: fail naming the fix).
   */
  enableBroker?: boolean;
  /** WAITFOR timeout of an idle reader, ms (default 5,000). */
  waitTimeoutMs?: number;
  /** Request timeout of reader connections, ms; must exceed waitTimeoutMs by 5 s (default waitTimeoutMs + 15 s). */
  requestTimeoutMs?: number;
  /** Slow poll covering lost activation notifications and checking the event notification, ms (default 10,000). */
  pollIntervalMs?: number;
  /** Dialogs shared by sends without a group key (default 8). */
  unkeyedDialogs?: number;
  /** Age after which a dialog is recycled through the close handshake, ms (default 1 day; null: never). */
  dialogRecycleMs?: number | null;
  /**
   * Table queues on SQL Server: an enqueue rings a Service Broker doorbell so that idle readers
   * in other processes wake at once instead of at their next poll (the SQL Server counterpart of
   * PostgreSQL's NOTIFY; default false). With it, `queues` may be empty.
   */
  doorbell?: boolean;
}

/** A schema-scoped object (a Service Broker queue): both parts validated, quote when used. */
export interface BrokerObjectName {
  schema: string;
  name: string;
}

export interface ResolvedBrokerQueue {
  /** The option key: what `@QueueHandler(name)` and `send(name, …)` use. */
  name: string;
  queue: BrokerObjectName;
  service: string;
  contract: string;
  messageType: string;
  closeMessageType: string;
  initiatorQueue: BrokerObjectName;
  initiatorService: string;
  /** Event notification names, on `queue` (QUEUE_ACTIVATION and BROKER_QUEUE_DISABLED). */
  activationNotification: string;
  disabledNotification: string;
  format: BrokerBodyFormat;
  minReaders: number;
  maxReaders: number;
  maxAttempts: number;
  retryDelay: RetryDelay;
  messagesPerTransaction: number;
  maxDurationMs: number | null;
  /** The internal doorbell queue (broker.doorbell): no event notifications, never a handler's. */
  doorbell?: true;
}

export interface ResolvedBrokerOptions {
  /** The module schema: our tables (BrokerAttempts, BrokerDead, BrokerDialogs, BrokerOutbox) live there. */
  schema: string;
  setup: BrokerSetupMode;
  enableBroker: boolean;
  waitTimeoutMs: number;
  requestTimeoutMs: number;
  pollIntervalMs: number;
  unkeyedDialogs: number;
  dialogRecycleMs: number | null;
  /** Where QUEUE_ACTIVATION / BROKER_QUEUE_DISABLED events arrive (one per module schema). */
  notificationQueue: BrokerObjectName;
  notificationService: string;
  queues: ResolvedBrokerQueue[];
  /** The doorbell's queue, services and message types (broker.doorbell), apart from `queues`. */
  doorbell: ResolvedBrokerQueue | null;
}

/** What a handler of a broker queue knows about the message it runs. */
export interface BrokerMessageContext {
  /** The broker queue's name (the `broker.queues` key). */
  queue: string;
  conversationHandle: string;
  conversationGroupId: string;
  messageTypeName: string;
  /** Decimal string (bigint). Within a conversation, messages arrive in this order. */
  messageSequenceNumber: string;
  /** 1 for the first run of this message. */
  attempt: number;
  maxAttempts: number;
  /** Aborts when the handler runs past maxDurationMs or the application shuts down. */
  signal: AbortSignal;
}

/** A broker queue's handler as the broker runtime sees it. */
export type BrokerHandler = (body: unknown, context: BrokerMessageContext) => Promise<void>;

// ---- The driver port: what the broker needs from SQL Server. broker.mssql-driver.ts implements
// it over mssql; unit tests use a recorded double (no SQL Server runs on our CI machines).

export type BrokerParamType = 'int' | 'bigint' | 'bit' | 'nvarchar' | 'uniqueidentifier' | 'varbinary' | 'datetime2';

export interface BrokerParam {
  type: BrokerParamType;
  value: unknown;
}

export type BrokerParams = Record<string, BrokerParam>;

export type BrokerRow = Record<string, unknown>;

/** One connection pinned inside one open transaction. One request at a time (tedious). */
export interface BrokerSession {
  /** Runs one batch (sp_executesql with the params); resolves to the last result set's rows. */
  query<R extends BrokerRow = BrokerRow>(text: string, params?: BrokerParams): Promise<R[]>;
  /** Sends an attention for the statement in flight (an idle WAITFOR); it rejects, the transaction stays open. */
  cancel(): void;
  commit(): Promise<void>;
  rollback(): Promise<void>;
}

export interface BrokerDriver {
  /**
   * A transaction on a reader connection: a dedicated pool (one connection per reader, plus the
   * listener's), XACT_ABORT OFF, requestTimeout above the WAITFOR timeout.
   */
  beginReader(): Promise<BrokerSession>;
  /**
   * A transaction on the shared pool, or the caller's own open transaction (an mssql
   * Transaction) whose commit and rollback stay the caller's: then commit()/rollback() do nothing.
   */
  begin(callerTransaction?: unknown): Promise<BrokerSession>;
  /** One autocommit batch on the shared pool (journal, health, setup). */
  query<R extends BrokerRow = BrokerRow>(text: string, params?: BrokerParams): Promise<R[]>;
  /** The SQL Server error number of a failed request, if it has one. */
  errorNumber(error: unknown): number | undefined;
  /** True for the rejection of a request stopped by cancel(). */
  isCancelled(error: unknown): boolean;
  close(): Promise<void>;
}

/** A message in the dead table of a broker queue. */
export interface BrokerDeadMessage {
  /** Row id in the dead table (decimal string): what retry and purge take. */
  id: string;
  queue: string;
  conversationHandle: string;
  conversationGroupId: string;
  messageSequenceNumber: string;
  messageTypeName: string;
  /** Decoded per the queue's format (parsed JSON, Buffer, XML text); a body that no longer decodes is its Buffer. */
  body: unknown;
  /** Handler runs started. */
  attempts: number;
  /** Of those, runs that ended in a full rollback (a crash or lost connection), not a handler error. */
  crashes: number;
  lastError: string | null;
  reason: BrokerDeadReason;
  deadAt: Date;
}

export interface BrokerDeadMessagePage {
  messages: BrokerDeadMessage[];
  /** Pass as `afterId` for the next page; null at the end. */
  nextAfterId: string | null;
}

/** Figures of one broker queue, read with bounded statements. */
export interface BrokerQueueStats {
  /** Messages in the Service Broker queue (from its internal table's row count, never a scan). */
  messagesWaiting: number;
  /** Messages in the dead table for this queue. */
  dead: number;
}

/** A broker queue's state in this process, for health and metrics (no database round trip). */
export interface BrokerQueueSnapshot {
  queue: string;
  consumed: boolean;
  readers: number;
  busyReaders: number;
  minReaders: number;
  maxReaders: number;
  /** Engine clock (ms) of the last activation, or null. */
  lastActivationAt: number | null;
  /** A BROKER_QUEUE_DISABLED event arrived and no later check saw the queue enabled. */
  disabledSeen: boolean;
  /** The queue's event notification was found missing or broken and is not recreated yet. */
  notificationProblem: string | null;
}

export interface BrokerSnapshot {
  running: boolean;
  /** The activation listener's last completed loop (engine clock ms), null before the first or when not running. */
  listenerLastLoopAt: number | null;
  queues: BrokerQueueSnapshot[];
}

/** The result of a broker health reading: healthy, or the problems that make it not. */
export interface BrokerHealthReading {
  healthy: boolean;
  problems: string[];
  details: Record<string, unknown>;
}

/** What a send did. */
export interface BrokerSent {
  /**
   * The dialog the message went on; null when it waits in the outbox because its key's dialog is
   * being recycled (it goes out, in order, on the key's next dialog once the old one has ended).
   */
  conversationHandle: string | null;
}

/** What the Nest layer uses of the Service Broker transport (implemented by broker.runtime.ts). */
export interface BrokerRuntimeApi {
  readonly options: ResolvedBrokerOptions;
  queue(name: string): ResolvedBrokerQueue | undefined;
  register(name: string, handler: BrokerHandler): void;
  start(): Promise<void>;
  stop(timeoutMs: number): Promise<void>;
  close(): Promise<void>;
  snapshot(): BrokerSnapshot;
  send(name: string, body: unknown, options?: { groupKey?: string; transaction?: unknown }): Promise<BrokerSent>;
  listDeadMessages(name: string, page?: { limit?: number; afterId?: string | null }): Promise<BrokerDeadMessagePage>;
  retryDeadMessages(name: string, ids: readonly string[] | 'all'): Promise<string[]>;
  purgeDeadMessages(name: string, options?: { olderThanMs?: number }): Promise<number>;
  stats(name: string): Promise<BrokerQueueStats>;
  /** Endpoints of this database's conversations by state (CONVERSING, DISCONNECTED_INBOUND, CLOSED, …). */
  conversationEndpoints(): Promise<Record<string, number>>;
  health(name: string): Promise<BrokerHealthReading>;
  /** The table-queue doorbell (broker.doorbell), or null. */
  readonly doorbell: BrokerDoorbellApi | null;
}

/** Cross-process wake-ups of table queues over Service Broker (broker.doorbell). */
export interface BrokerDoorbellApi {
  /** Rings for a table queue (its own short transaction), unless a ring of it is waiting already. */
  ring(tableQueue: string): Promise<void>;
  /** Calls onWake for each table queue rung; the returned function stops listening. */
  listen(onWake: (tableQueue: string) => void): Promise<() => Promise<void>>;
}
