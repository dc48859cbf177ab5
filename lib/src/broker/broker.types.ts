import type { JobContext, JobHandler } from '../core/consumer/index.js';
import type { QueueOptions } from '../core/options.js';

// Service Broker transport: the shapes every part of lib/src/broker/ shares. Nothing here loads
// `mssql` (an optional peer); only driver/broker.mssql-driver.ts does, and it is loaded on demand.

/** How a message body is handed to the handler: parsed JSON, the raw bytes, or XML text. */
export type BrokerBodyFormat = 'json' | 'raw' | 'xml';

/** `auto` creates missing broker objects at boot; `print` logs the script and fails; `off` only checks. */
export type BrokerSetupMode = 'auto' | 'print' | 'off';

/**
 * One broker queue, as a user declares it under `broker.queues[name]`. Every name is optional.
 *
 * Receivers move the queue's messages, in the transaction that RECEIVEs them, into the table
 * queue of the same name as jobs of one ordered group per conversation group; handlers then run
 * them as table-queue jobs (leases, retries with backoff, the dead state). So the table-queue
 * options apply here too (`maxReaders` is how many handlers run at once in this process), with
 * other defaults: maxAttempts 5, backoff exponential from 1 s to 1 min, groupBatchSize 10.
 */
export interface BrokerQueueOptions extends QueueOptions {
  /** The Service Broker queue receivers RECEIVE from: 'name' (in the module schema) or 'schema.name'. */
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
  /** Receivers kept waiting in RECEIVE when the queue is idle, in this process (default 1). */
  minReceivers?: number;
  /**
   * Most receivers of this queue in this process (default 2): QUEUE_ACTIVATION starts one more
   * when messages pile up faster than they move. A receiver never runs a handler.
   */
  maxReceivers?: number;
  /** Messages one move transaction RECEIVEs and hands to the table queue (default 100). */
  messagesPerTransaction?: number;
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
  /** The option key: what `@QueueHandler(name)` and `send(name, …)` use, and the table queue's name. */
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
  minReceivers: number;
  maxReceivers: number;
  messagesPerTransaction: number;
  /**
   * The table-queue options of the handler side, validated, with the broker defaults filled in
   * where the user set nothing (maxAttempts, backoff, groupBatchSize); `@QueueHandler` options go
   * over them.
   */
  handlerOptions: QueueOptions;
  /** The internal doorbell queue (broker.doorbell): no event notifications, never a handler's. */
  doorbell?: true;
}

export interface ResolvedBrokerOptions {
  /** The module schema: our tables (BrokerDialogs, BrokerOutbox, and the table queue's) live there. */
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

/**
 * What a handler of a broker queue knows about the message it runs: the job's context (its
 * attempt, signal, lease) and where the message came from.
 */
export interface BrokerMessageContext extends JobContext {
  conversationHandle: string;
  conversationGroupId: string;
  messageTypeName: string;
  /** Decimal string (bigint). Within a conversation, messages are handled in this order. */
  messageSequenceNumber: string;
}

/** A broker queue's handler as the broker runtime sees it. */
export type BrokerHandler = (body: unknown, context: BrokerMessageContext) => Promise<void>;

// ---- The driver port: what the broker needs from SQL Server. driver/broker.mssql-driver.ts implements
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

/**
 * A connection of its own, outside any pool another part shares: a receiver's. Each batch runs
 * in autocommit unless it opens a transaction itself. One request at a time (tedious).
 */
export interface BrokerConnection {
  /** Runs one batch; resolves to the last result set's rows. */
  query<R extends BrokerRow = BrokerRow>(text: string, params?: BrokerParams): Promise<R[]>;
  /** Sends an attention for the statement in flight (an idle WAITFOR); it rejects with a cancellation. */
  cancel(): void;
  /** Closes the connection: a transaction still open on it rolls back on the server. */
  close(): Promise<void>;
}

export interface BrokerDriver {
  /**
   * A transaction on a reader connection: a dedicated pool (the activation listener's, the
   * initiator readers' and the doorbell's), XACT_ABORT OFF, requestTimeout above the WAITFOR timeout.
   */
  beginReader(): Promise<BrokerSession>;
  /**
   * A transaction on the shared pool, or the caller's own open transaction (an mssql
   * Transaction) whose commit and rollback stay the caller's: then commit()/rollback() do nothing.
   */
  begin(callerTransaction?: unknown): Promise<BrokerSession>;
  /**
   * One autocommit batch on the shared pool (health, setup, figures), run behind the store's
   * autocommit guard: it refuses a connection with an open transaction and resets the session
   * options a shared pool may carry over (MSSQL_AUTOCOMMIT_SESSION).
   */
  query<R extends BrokerRow = BrokerRow>(text: string, params?: BrokerParams): Promise<R[]>;
  /** A connection of its own (reader settings), for a receiver. */
  openConnection(): Promise<BrokerConnection>;
  /** The SQL Server error number of a failed request, if it has one. */
  errorNumber(error: unknown): number | undefined;
  /** True for the rejection of a request stopped by cancel(). */
  isCancelled(error: unknown): boolean;
  close(): Promise<void>;
}

/** A dead job of a broker queue, as the message it carries. */
export interface BrokerDeadMessage {
  /** The dead job's id (decimal string): what retry and purge take. */
  id: string;
  queue: string;
  conversationHandle: string;
  conversationGroupId: string;
  messageSequenceNumber: string;
  messageTypeName: string;
  /** Decoded per the queue's format (parsed JSON, Buffer, XML text); a body that does not decode is its Buffer. */
  body: unknown;
  /** Handler runs started (lease expiries included). */
  attempts: number;
  lastError: string | null;
  deadAt: Date | null;
  /** The body's size when it was too large to keep (over maxPayloadBytes): `body` is null then. */
  droppedBytes: number | null;
}

export interface BrokerDeadMessagePage {
  messages: BrokerDeadMessage[];
  /** Pass as `afterId` for the next page; null at the end. */
  nextAfterId: string | null;
}

/** Figures of one broker queue, read with bounded statements. */
export interface BrokerQueueStats {
  /** Messages in the Service Broker queue, not yet moved to the table queue (from its internal table's row count, never a scan). */
  messagesWaiting: number;
  /** Dead jobs of the broker queue's table queue. */
  dead: number;
}

/** A broker queue's state in this process, for health and metrics (no database round trip). */
export interface BrokerQueueSnapshot {
  queue: string;
  consumed: boolean;
  receivers: number;
  /** Receivers in a move transaction right now (the rest wait in RECEIVE). */
  busyReceivers: number;
  minReceivers: number;
  maxReceivers: number;
  /** Engine clock (ms) of the last activation, or null. */
  lastActivationAt: number | null;
  /**
   * Engine clock (ms) since which every receiver round failed (a move the server refuses each
   * time, or no database), null while they succeed; and the last error then.
   */
  failingSince: number | null;
  lastError: string | null;
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
  /**
   * Starts receivers of broker queue `name` at start(): they move its messages into its table
   * queue, whose jobs `maxAttempts` (the handler's resolved value) is the default of.
   */
  register(name: string, options: { maxAttempts: number }): void;
  /** The table-queue handler of broker queue `name`'s jobs: decodes each message and calls `handler`. */
  jobHandler(name: string, handler: BrokerHandler): JobHandler;
  start(): Promise<void>;
  stop(timeoutMs: number): Promise<void>;
  close(): Promise<void>;
  snapshot(): BrokerSnapshot;
  send(name: string, body: unknown, options?: { groupKey?: string; transaction?: unknown }): Promise<BrokerSent>;
  /** The dead jobs of broker queue `name`, as the messages they carry. */
  listDeadMessages(name: string, page?: { limit?: number; afterId?: string | null }): Promise<BrokerDeadMessagePage>;
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

/**
 * What a reader loop needs from a reader: the receiver (reader/broker.receiver.ts) and the initiator
 * reader satisfy it, and tests pass fakes. One instance per loop (it owns its connection or
 * pins one per transaction).
 */
export interface BrokerReaderLoop {
  /**
   * One round: 'empty' after a wait that found nothing, 'handled' after it took (and committed)
   * messages, 'stopped' once stop() ended it. Rejects on a database error.
   */
  runOnce(): Promise<'empty' | 'handled' | 'stopped'>;
  /** Ends the reader: cancels an idle WAITFOR at once and lets a round in flight finish; never a full rollback. */
  stop(): unknown;
  /** True while it is taking messages; feeds the busy count when the reader tells it. */
  readonly busy?: boolean;
}

/** What started a receiver: a QUEUE_ACTIVATION notification, or the slow poll. */
export type BrokerActivationSource = 'notification' | 'poll';
