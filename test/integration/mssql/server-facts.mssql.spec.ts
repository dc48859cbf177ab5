/**
 * What only a real SQL Server can settle (review 2, "Facts only a real server can settle", items
 * 1-14), and what the Service Broker redesign of issue 21 relies on (a-m), one experiment each, on
 * both databases (RCSI off and on).
 *
 * Each experiment records what the server did (console.info, one JSON line per fact, also put in
 * the assertion messages, so a failing CI log shows it) and asserts only what OUR CODE ASSUMES, so
 * the first run on a server tells which assumption broke. Where the old design's assumption no
 * longer matters, the test name says so and asserts what the new design assumes instead; the old
 * question is still observed and logged.
 *
 * Everything runs in a schema of its own with broker queues of its own (every queue created as
 * the library creates them, POISON_MESSAGE_HANDLING OFF; the scratch queues named *_on are
 * altered to ON to observe what the server does there). Statements the library sends are taken
 * from lib/src as they are; the test's own are in test/helpers/server-facts-queries.ts. Facts that
 * need VIEW SERVER STATE (other sessions' locks) or ALTER ANY CONNECTION (KILL) skip, or skip the
 * part that needs it, naming the permission.
 *
 * Pages relied on (Microsoft Learn, MicrosoftDocs/sql-docs):
 * - Removing Poison Messages, Handling Poison Messages (five rollbacks disable the queue; a partial
 *   rollback keeps the conversation group lock):
 *   https://learn.microsoft.com/sql/database-engine/service-broker/removing-poison-messages
 *   https://learn.microsoft.com/sql/database-engine/service-broker/handling-poison-messages
 * - ALTER QUEUE ("A queue that has poison message handling set to OFF will not be disabled after
 *   five consecutive transaction rollbacks"): https://learn.microsoft.com/sql/t-sql/statements/alter-queue-transact-sql
 * - Public reports of the disable's Sch-M wait behind an open RECEIVE (also with the option OFF):
 *   https://dba.stackexchange.com/q/73833, https://straightforwardsql.com/posts/service-broker-blocking
 * - RECEIVE (INTO a table variable: same number of columns, implicitly convertible; one
 *   conversation group per statement; an empty result set without WAITFOR; a WHERE naming a group
 *   that does not exist is an error): https://learn.microsoft.com/sql/t-sql/statements/receive-transact-sql
 * - GET CONVERSATION GROUP (locks the group; NULL after the timeout):
 *   https://learn.microsoft.com/sql/t-sql/statements/get-conversation-group-transact-sql
 * - END CONVERSATION (removes the conversation's messages from the queue; WITH ERROR drops its
 *   messages still in the transmission queue; a SEND after it is an error):
 *   https://learn.microsoft.com/sql/t-sql/statements/end-conversation-transact-sql
 * - sys.conversation_endpoints (an endpoint that ended first is DO until the far side acknowledges,
 *   then CD): https://learn.microsoft.com/sql/relational-databases/system-catalog-views/sys-conversation-endpoints-transact-sql
 * - XACT_STATE (1: the transaction can still commit; -1: only a full rollback is left):
 *   https://learn.microsoft.com/sql/t-sql/functions/xact-state-transact-sql
 * - Error numbers 8426, 8427, 8429:
 *   https://learn.microsoft.com/sql/relational-databases/errors-events/database-engine-events-and-errors-8000-to-8999
 * - sys.dm_tran_locks (OBJECT resources name their object id; VIEW SERVER STATE):
 *   https://learn.microsoft.com/sql/relational-databases/system-dynamic-management-views/sys-dm-tran-locks-transact-sql
 * - SET IMPLICIT_TRANSACTIONS (SELECT from a table and BEGIN TRANSACTION open one):
 *   https://learn.microsoft.com/sql/t-sql/statements/set-implicit-transactions-transact-sql
 * - SAVE TRANSACTION / ROLLBACK TRANSACTION, and MS-TDS ENVCHANGE (type 10: rollback transaction):
 *   https://learn.microsoft.com/sql/t-sql/language-elements/save-transaction-transact-sql
 *   https://learn.microsoft.com/openspecs/windows_protocols/ms-tds/2b3eb7e5-d43d-4d1b-bf4d-76b9e3afc791
 * - sp_getapplock, table hints (READCOMMITTEDLOCK, TABLOCKX), the locking and row versioning
 *   guide (key-range locks, update conflicts 3960):
 *   https://learn.microsoft.com/sql/relational-databases/system-stored-procedures/sp-getapplock-transact-sql
 *   https://learn.microsoft.com/sql/t-sql/queries/hints-transact-sql-table
 *   https://learn.microsoft.com/sql/relational-databases/sql-server-transaction-locking-and-row-versioning-guide
 * - SET LOCK_TIMEOUT: https://learn.microsoft.com/sql/t-sql/statements/set-lock-timeout-transact-sql
 * - KILL (ALTER ANY CONNECTION): https://learn.microsoft.com/sql/t-sql/language-elements/kill-transact-sql
 * - FOR JSON (varbinary as BASE64; NULLs left out without INCLUDE_NULL_VALUES):
 *   https://learn.microsoft.com/sql/relational-databases/json/how-for-json-converts-sql-server-data-types-to-json-data-types-sql-server
 *   https://learn.microsoft.com/sql/relational-databases/json/include-null-values-in-json-include-null-values-option
 * - uniqueidentifier, datetime2, CAST and CONVERT:
 *   https://learn.microsoft.com/sql/t-sql/data-types/uniqueidentifier-transact-sql
 *   https://learn.microsoft.com/sql/t-sql/data-types/datetime2-transact-sql
 *   https://learn.microsoft.com/sql/t-sql/functions/cast-and-convert-transact-sql
 * - Understanding When Activation Occurs, Event-Based Activation (an external reader gets a
 *   time-out during which "Service Broker will not produce another notification"):
 *   https://learn.microsoft.com/sql/database-engine/service-broker/understanding-when-activation-occurs
 *   https://learn.microsoft.com/sql/database-engine/service-broker/event-based-activation
 * - ALTER INDEX (ALLOW_PAGE_LOCKS): https://learn.microsoft.com/sql/t-sql/statements/alter-index-transact-sql
 */
import { randomUUID } from 'node:crypto';
import sql from 'mssql';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { encodeBrokerBody } from '../../../lib/src/broker/broker.body.js';
import {
  brokerJobBytes,
  readBrokerJobPayload,
  type BrokerJobPayload,
} from '../../../lib/src/broker/reader/broker.job.js';
import {
  readBrokerQueueHealth,
  readBrokerQueueLocks,
} from '../../../lib/src/broker/activation/broker.listener.queries.js';
import { createMssqlBrokerDriver, readerPoolConfig } from '../../../lib/src/broker/driver/broker.mssql-driver.js';
import { BROKER_SYSTEM, quoteBrokerObject } from '../../../lib/src/broker/broker.names.js';
import { resolveBrokerOptions } from '../../../lib/src/broker/broker.options.js';
import {
  endClosedConversation,
  moveMessages,
  waitForMessages,
} from '../../../lib/src/broker/reader/broker.receiver.queries.js';
import {
  DIALOG_GONE_ERRORS,
  giveBackInitiatorMessages,
  lockDialog,
  MSSQL_END_STATE_ERROR,
  MSSQL_HANDLE_NOT_FOUND,
  MSSQL_SEND_STATE_ERROR,
  receiveInitiator,
} from '../../../lib/src/broker/sender/broker.sender.queries.js';
import {
  brokerEnableQueueStatement,
  brokerEventNotificationBatch,
  brokerSetupBatches,
  brokerTeardownBatches,
} from '../../../lib/src/broker/setup/broker.setup.js';
import type {
  BrokerObjectName,
  ResolvedBrokerOptions,
  ResolvedBrokerQueue,
} from '../../../lib/src/broker/broker.types.js';
import type { QueueStore } from '../../../lib/src/core/queue-store.js';
import { DEFAULT_MAX_PAYLOAD_BYTES } from '../../../lib/src/core/validation.js';
import { prepareJob } from '../../../lib/src/core/producer/job-validation.js';
import { createMssqlStore } from '../../../lib/src/store/mssql/mssql.connect.js';
import { SqlQueueTransactionError } from '../../../lib/src/core/errors.js';
import {
  MSSQL_AUTOCOMMIT_SESSION,
  MSSQL_NESTED_OWN_TRANSACTION,
  mssqlEnqueueInTransaction,
} from '../../../lib/src/store/mssql/mssql.queries.js';
import {
  END_CONVERSATION,
  END_CONVERSATION_WITH_ERROR,
  ENDPOINTS_OF_CONVERSATION,
  sendOnNewDialog,
} from '../../helpers/broker-test-queries.js';
import { within } from '../../helpers/drills.js';
import {
  beginCallerTransaction,
  mssqlErrorNumber,
  mssqlPoolConfig,
  openMssqlPool,
  type CallerTransaction,
} from '../../helpers/mssql.js';
import {
  INDEX_LOCK_OPTIONS,
  LEAVE_IMPLICIT_TRANSACTIONS,
  LOCKS_OF_SESSION,
  PAGE_LOCKS_ON_QUEUE_TABLES,
  ROLLBACK_LEFTOVER,
  SESSION_STATE,
  startSnapshot,
  type SessionLockRow,
} from '../../helpers/mssql-test-queries.js';
import {
  conversationGroupNow,
  countDialogs,
  DATETIME2_ROUNDING,
  DMV_READ,
  enablePoisonHandling,
  END_AGAIN_AND_UNKNOWN_IN_TRANSACTION,
  enqueueNowOnClock,
  FOR_JSON_PROBE,
  groupRow,
  holdJobsTable,
  insertDialogRow,
  jobsOfQueue,
  keyedJobLocking,
  keyedJobPlain,
  KILL_SESSION,
  messagesOfConversation,
  QUEUE_FLAGS,
  QUEUE_OBJECT_LOCKS,
  queuedMessagesOfConversation,
  readyMessages,
  receiveAndGiveBack,
  receiveFirstOfConversation,
  receiveGroupAfterEnd,
  receiveIntoTooFewColumns,
  receiveNext,
  receiveNotificationTimes,
  receiveOfGroup,
  receiveTwiceInto,
  SAVEPOINT_ROUND_TRIP,
  sendOnConversation,
  SERVER_PERMISSIONS,
  touchGroupRow,
  TRANSMISSION_QUEUE_OF_CONVERSATION,
  waitForGroup,
  withLockTimeout,
} from '../../helpers/server-facts-queries.js';
import { waitFor } from '../../helpers/wait-for.js';
import { describeEachMssqlDatabase, useMssqlSchema } from './mssql-databases.js';

/** The broker queues of this file, one per experiment (or pair: *_on altered to POISON_MESSAGE_HANDLING ON). */
const Q = {
  poisonOn: 'poison_on',
  poisonOff: 'poison_off',
  perQueueOn: 'per_queue_on',
  perQueueOff: 'per_queue_off',
  perMessageOn: 'per_message_on',
  perMessageOff: 'per_message_off',
  waitedOn: 'waited_on',
  waitedOff: 'waited_off',
  killOn: 'kill_on',
  killOff: 'kill_off',
  savepoint: 'savepoint',
  ddl: 'ddl',
  race: 'race',
  order: 'get_order',
  errors: 'errors',
  endReceive: 'end_receive',
  activation: 'activation',
  wait: 'wait',
  into: 'into',
  types: 'types',
  json: 'json',
  move: 'move',
  cancel: 'cancel',
  endTwice: 'end_twice',
  schemaLock: 'schema_lock',
  endDrops: 'end_drops',
  errorEnd: 'error_end',
  endInTransaction: 'end_in_tran',
} as const;
const POISON_ON_QUEUES = [Q.poisonOn, Q.perQueueOn, Q.perMessageOn, Q.waitedOn, Q.killOn];

const LIMITS = { maxPayloadBytes: 1024, defaultMaxAttempts: 5 };
const WORKER = 'server-facts';
/** A blocked probe gives up after this (SET LOCK_TIMEOUT): 1222 means "it would have waited". */
const PROBE_LOCK_TIMEOUT_MS = 1_000;
/** How long a scratch queue is watched for the poison disable after the experiment's rollbacks. */
const DISABLE_WATCH_MS = 5_000;
const LOCK_TIMEOUT = 1222;
const SNAPSHOT_UPDATE_CONFLICT = 3960;

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

type Bind = (request: sql.Request) => sql.Request;

type Outcome<T> =
  | { ok: true; value: T; ms: number }
  | { ok: false; error: number | undefined; message: string; ms: number; cause: unknown };

/** What a promise did, and how long it took, without throwing (the error number, when SQL Server's). */
async function outcome<T>(promise: Promise<T>): Promise<Outcome<T>> {
  const start = Date.now();
  try {
    const value = await promise;
    return { ok: true, value, ms: Date.now() - start };
  } catch (cause) {
    return {
      ok: false,
      error: mssqlErrorNumber(cause),
      message: (cause as Error).message,
      ms: Date.now() - start,
      cause,
    };
  }
}

/** An outcome for a log line (no rows, no cause). */
function brief(o: Outcome<unknown>): Record<string, unknown> {
  return o.ok ? { ok: true, ms: o.ms } : { ok: false, error: o.error, message: o.message.slice(0, 200), ms: o.ms };
}

/** A promise watched as it runs: `state.settled` turns true when it settles; `done` never rejects. */
function track<T>(promise: Promise<T>): { state: { settled: boolean }; done: Promise<Outcome<T>> } {
  const state = { settled: false };
  const done = outcome(promise).then((o) => {
    state.settled = true;
    return o;
  });
  return { state, done };
}

/** Runs `text` on a pool (autocommit) or in a transaction; the last result set's rows, as the broker driver reads them. */
async function run<R>(on: sql.ConnectionPool | sql.Transaction, text: string, bind: Bind = (r) => r): Promise<R[]> {
  const request = on instanceof sql.Transaction ? new sql.Request(on) : on.request();
  const result = await bind(request).query(text);
  const sets = (result.recordsets ?? []) as unknown as R[][];
  return sets.length > 0 ? sets[sets.length - 1]! : [];
}

type SessionState = { Spid: number; TranCount: number; ImplicitTransactions: number };
type Flags = { ReceiveEnabled: number; PoisonHandling: number };
type Endpoint = { Initiator: number; State: string; Handle: string; GroupId: string };
type QueueLock = { Session: number; Mode: string; Status: string; UserProcess: number | null; Command: string | null };
type LocksReading = {
  SchemaLockWaiters: number | string;
  HolderSession: number | null;
  HolderAgeMs: number | string | null;
};
type MoveRow = { Received: number; Moved: number; Ended: number; Errors: string | null };
type JobRow = { Id: string; State: string; GroupKey: string | null; Payload: string };
type QueuedMessage = { Type: string; Sequence: string; QueuingOrder: string; Status: number };
type EndInTransactionRow = {
  AgainError: number;
  AgainXactState: number | null;
  UnknownError: number;
  UnknownXactState: number | null;
  XactState: number;
  TranCount: number;
};

/** A dialog our test producer opened: the initiator's handle, and the target's handle and conversation group. */
interface Dialog {
  initiator: string;
  target: string;
  group: string;
}

describeEachMssqlDatabase('facts only a real SQL Server can settle, and what the broker redesign assumes', (db) => {
  const { schema, store, newQueue } = useMssqlSchema(db, 'facts', 4);
  let admin: sql.ConnectionPool;
  let options: ResolvedBrokerOptions;
  const perms = { viewServerState: false, alterAnyConnection: false };

  beforeAll(async () => {
    admin = await openMssqlPool(db.url, 8);
  });
  afterAll(async () => {
    await admin?.close();
  });

  // Registered after the pool's hooks: its teardown runs before the pool closes ('stack' order),
  // and before useMssqlSchema drops the schema (a schema with queues cannot be dropped).
  beforeAll(async () => {
    options = resolveBrokerOptions({ queues: Object.fromEntries(Object.values(Q).map((name) => [name, {}])) }, schema)!;
    for (const batch of brokerSetupBatches(options)) await admin.request().batch(batch);
    for (const name of POISON_ON_QUEUES) await admin.request().batch(enablePoisonHandling(queue(name).queue));
    const [granted] = await run<{ ViewServerState: number | null; AlterAnyConnection: number | null }>(
      admin,
      SERVER_PERMISSIONS,
    );
    perms.viewServerState = granted?.ViewServerState === 1;
    perms.alterAnyConnection = granted?.AlterAnyConnection === 1;
    log('permissions', perms);
  }, 120_000);
  afterAll(async () => {
    if (!options) return;
    for (const batch of brokerTeardownBatches(options)) {
      await admin
        .request()
        .batch(batch)
        .catch((error: unknown) => console.warn(`server-facts teardown: ${(error as Error).message}`));
    }
  }, 120_000);

  function log(fact: string, observed: unknown): void {
    console.info(`server-facts [${db.label}] ${fact}: ${JSON.stringify(observed)}`);
  }

  function queue(name: string): ResolvedBrokerQueue {
    const found = options.queues.find((q) => q.name === name);
    if (!found) throw new Error(`no broker queue ${name} in this file`);
    return found;
  }

  function bytes(body: unknown): Buffer {
    return Buffer.isBuffer(body) ? body : encodeBrokerBody('json', body, 1 << 20, 'server facts');
  }

  async function endpointsOf(handle: string): Promise<Endpoint[]> {
    return run<Endpoint>(admin, ENDPOINTS_OF_CONVERSATION, (r) => r.input('handle', sql.UniqueIdentifier, handle));
  }

  /** Opens a dialog to broker queue `name` and sends `bodies` on it, in order; waits for the target's endpoint. */
  async function openDialog(name: string, bodies: readonly unknown[]): Promise<Dialog> {
    const q = queue(name);
    const [first, ...rest] = bodies;
    const [opened] = await run<{ Handle: string }>(admin, sendOnNewDialog(q), (r) =>
      r.input('body', sql.VarBinary(sql.MAX), bytes(first)),
    );
    for (const body of rest) {
      await run(admin, sendOnConversation(q), (r) =>
        r.input('handle', sql.UniqueIdentifier, opened!.Handle).input('body', sql.VarBinary(sql.MAX), bytes(body)),
      );
    }
    const endpoints = await waitFor(
      () => endpointsOf(opened!.Handle),
      (rows) => rows.some((e) => e.Initiator === 0),
      { timeoutMs: 10_000, what: `the target endpoint of a new dialog to ${name}` },
    );
    const target = endpoints.find((e) => e.Initiator === 0)!;
    return { initiator: opened!.Handle, target: target.Handle, group: target.GroupId };
  }

  /**
   * Messages ready in a queue: -1 when even the NOLOCK read waited past its lock timeout, -2 when
   * it failed otherwise (logged), so an observation of a scratch queue never throws.
   */
  async function ready(on: BrokerObjectName): Promise<number> {
    const read = await outcome(run<{ Messages: number }>(admin, withLockTimeout(2_000, readyMessages(on))));
    if (!read.ok) {
      if (read.error === LOCK_TIMEOUT) return -1;
      console.warn(`server-facts: reading ${quoteBrokerObject(on)} failed: ${read.message}`);
      return -2;
    }
    return Number(read.value[0]?.Messages ?? 0);
  }

  /** The queue's flags; 'blocked' when the catalog read waited past its lock timeout. */
  async function flags(name: string): Promise<Flags | 'blocked'> {
    const read = await outcome(
      run<Flags>(admin, withLockTimeout(2_000, QUEUE_FLAGS), (r) =>
        r.input('queue', sql.NVarChar(300), quoteBrokerObject(queue(name).queue)),
      ),
    );
    if (!read.ok) {
      if (read.error === LOCK_TIMEOUT) return 'blocked';
      throw read.cause;
    }
    return read.value[0]!;
  }

  async function enabled(name: string): Promise<number | 'blocked'> {
    const f = await flags(name);
    return f === 'blocked' ? f : f.ReceiveEnabled;
  }

  /**
   * The lock manager's rows on the queue object (VIEW SERVER STATE), null without the permission,
   * or what went wrong reading them (an observation never throws).
   */
  async function queueLocks(name: string): Promise<QueueLock[] | Record<string, unknown> | null> {
    if (!perms.viewServerState) return null;
    const read = await outcome(
      run<QueueLock>(admin, withLockTimeout(2_000, QUEUE_OBJECT_LOCKS), (r) =>
        r.input('queue', sql.NVarChar(300), quoteBrokerObject(queue(name).queue)),
      ),
    );
    return read.ok ? read.value : brief(read);
  }

  /** locksReading as an observation: its row, what went wrong, or null without VIEW SERVER STATE. */
  async function observedLocksReading(name: string): Promise<LocksReading | Record<string, unknown> | null> {
    if (!perms.viewServerState) return null;
    const read = await outcome(locksReading(name));
    return read.ok ? read.value : brief(read);
  }

  /** The health reading's own statement (readBrokerQueueLocks), as the broker driver sends it. */
  async function locksReading(name: string): Promise<LocksReading> {
    const [row] = await run<LocksReading>(
      admin,
      withLockTimeout(2_000, `${MSSQL_AUTOCOMMIT_SESSION}${readBrokerQueueLocks()}`),
      (r) => r.input('queue', sql.NVarChar(300), quoteBrokerObject(queue(name).queue)),
    );
    return row!;
  }

  async function kill(spid: number): Promise<void> {
    await run(admin, KILL_SESSION, (r) => r.input('spid', sql.Int, spid));
  }

  /** Watches queues for `ms`: for each, when (ms after the start) it was first seen disabled, or null. */
  async function watchDisable(names: readonly string[], ms: number): Promise<Record<string, number | null>> {
    const seen: Record<string, number | null> = Object.fromEntries(names.map((n) => [n, null]));
    const start = Date.now();
    while (Date.now() - start < ms) {
      for (const name of names) {
        if (seen[name] === null && (await enabled(name)) === 0) seen[name] = Date.now() - start;
      }
      await sleep(250);
    }
    return seen;
  }

  async function sessionState(on: sql.ConnectionPool | sql.Transaction): Promise<SessionState> {
    const [row] = await run<SessionState>(on, SESSION_STATE);
    return row!;
  }

  function moveBind(q: ResolvedBrokerQueue): Bind {
    return (r) => r.input('queue', sql.NVarChar(128), q.name).input('maxAttempts', sql.Int, 5);
  }

  async function jobs(tableQueue: string): Promise<(JobRow & { payload: BrokerJobPayload })[]> {
    const rows = await run<JobRow>(admin, jobsOfQueue(schema), (r) => r.input('queue', sql.NVarChar(128), tableQueue));
    return rows.map((row) => ({
      ...row,
      payload: readBrokerJobPayload(tableQueue, row.Id, JSON.parse(row.Payload) as unknown),
    }));
  }

  /** The JSON body a moved job carries (sent as UTF-16LE by our producer: moved as text). */
  function movedBody(payload: BrokerJobPayload): unknown {
    return payload.text === undefined ? undefined : (JSON.parse(payload.text) as unknown);
  }

  // ---- 1 -------------------------------------------------------------------------------------

  /**
   * Session A receives one message and keeps its transaction open; five other transactions each
   * receive the next message (another conversation) and roll back. Then, while A is open and after
   * A commits: the queue's flags, its locks (a BRKR task's Sch-M WAIT?), and whether a NOLOCK read
   * and a SEND queue behind it (probes with a 1 s lock timeout: 1222 = they would have waited).
   */
  async function fiveRollbacksBehindAnOpenReceive(name: string) {
    const q = queue(name);
    const held = await openDialog(name, [{ n: 1 }]);
    const other = await openDialog(name, [{ n: 2 }]);
    const holder = await beginCallerTransaction(db.url);
    const probes = async () => ({
      flags: await flags(name),
      locks: await queueLocks(name),
      reading: await observedLocksReading(name),
      nolockRead: brief(await outcome(run(admin, withLockTimeout(PROBE_LOCK_TIMEOUT_MS, readyMessages(q.queue))))),
      send: brief(
        await outcome(
          run(admin, withLockTimeout(PROBE_LOCK_TIMEOUT_MS, sendOnNewDialog(q)), (r) =>
            r.input('body', sql.VarBinary(sql.MAX), bytes({ probe: true })),
          ),
        ),
      ),
    });
    try {
      const [got] = await run<{ GroupId: string }>(holder.transaction, receiveOfGroup(q.queue), (r) =>
        r.input('group', sql.UniqueIdentifier, held.group),
      );
      const rolledBack: (string | null)[] = [];
      for (let i = 0; i < 5; i++) {
        const reader = await beginCallerTransaction(db.url);
        try {
          const [row] = await run<{ GroupId: string }>(reader.transaction, receiveNext(q.queue));
          rolledBack.push(row?.GroupId === other.group ? 'other' : (row?.GroupId ?? null));
        } finally {
          await reader.close(); // ROLLBACK: the receive counts toward the poison limit
        }
      }
      await sleep(1_500);
      const whileHeld = await probes();
      await holder.commit();
      const disabledAfterCommit = await watchDisable([name], DISABLE_WATCH_MS);
      const afterCommit = await probes();
      const receiveAfter = brief(await outcome(run(admin, withLockTimeout(2_000, receiveNext(q.queue)))));
      return {
        queue: name,
        holderGotItsMessage: got?.GroupId === held.group,
        rolledBack,
        whileHeld,
        disabledAfterCommitMs: disabledAfterCommit[name],
        afterCommit,
        receiveAfter,
      };
    } finally {
      await holder.close();
    }
  }

  it('fact 1 (R2-1, R2-4a): with POISON_MESSAGE_HANDLING OFF, five rolled-back receives behind an open RECEIVE leave the queue enabled, and it is readable and receivable once that transaction ends (observed: the Sch-M waiter, and what a queue created ON does)', async () => {
    expect(await flags(Q.poisonOn), 'scratch queue altered ON').toMatchObject({ PoisonHandling: 1 });
    expect(await flags(Q.poisonOff), 'queues are created OFF (broker.setup.ts)').toMatchObject({
      PoisonHandling: 0,
      ReceiveEnabled: 1,
    });
    const on = await fiveRollbacksBehindAnOpenReceive(Q.poisonOn);
    log('fact 1, POISON_MESSAGE_HANDLING ON (observed only)', on);
    const off = await fiveRollbacksBehindAnOpenReceive(Q.poisonOff);
    log('fact 1, POISON_MESSAGE_HANDLING OFF', off);
    const seen = JSON.stringify(off);
    expect(off.holderGotItsMessage, seen).toBe(true);
    expect(off.disabledAfterCommitMs, `the OFF queue was disabled: ${seen}`).toBeNull();
    expect(await enabled(Q.poisonOff), seen).toBe(1);
    // Once no transaction holds the queue, nothing queues behind a schema-lock waiter any more.
    expect(off.afterCommit.nolockRead, seen).toMatchObject({ ok: true });
    expect(off.receiveAfter, seen).toMatchObject({ ok: true });
    if (perms.viewServerState) {
      const reading = await waitFor(
        () => locksReading(Q.poisonOff),
        (r) => Number(r.SchemaLockWaiters) === 0,
        { timeoutMs: 5_000, what: 'no Sch-M waiter left on the OFF queue' },
      );
      expect(Number(reading.SchemaLockWaiters), seen).toBe(0);
    } else {
      console.warn('server-facts fact 1: lock observations skipped, the login lacks VIEW SERVER STATE');
    }
  }, 120_000);

  // ---- 2 -------------------------------------------------------------------------------------

  /** Five messages in five conversations, each received by its own transaction; all five roll back. */
  async function fiveRollbacksOfFiveMessages(name: string) {
    const q = queue(name);
    for (let i = 0; i < 5; i++) await openDialog(name, [{ n: i }]);
    const readers = await Promise.all(Array.from({ length: 5 }, () => beginCallerTransaction(db.url)));
    const got: (string | null)[] = [];
    try {
      for (const reader of readers) {
        const [row] = await run<{ GroupId: string }>(reader.transaction, receiveNext(q.queue));
        got.push(row?.GroupId ?? null);
      }
    } finally {
      await Promise.all(readers.map((reader) => reader.close()));
    }
    return { distinctGroups: new Set(got.filter((g) => g !== null)).size, expected: 5 };
  }

  /** Four rolled-back receives of conversation A's message, then one of B's. */
  async function fourOfOneThenOneOfAnother(name: string) {
    const q = queue(name);
    const a = await openDialog(name, [{ n: 'a' }]);
    const b = await openDialog(name, [{ n: 'b' }]);
    const received: number[] = [];
    for (const group of [a.group, a.group, a.group, a.group, b.group]) {
      const reader = await beginCallerTransaction(db.url);
      try {
        const rows = await run(reader.transaction, receiveOfGroup(q.queue), (r) =>
          r.input('group', sql.UniqueIdentifier, group),
        );
        received.push(rows.length);
      } finally {
        await reader.close();
      }
    }
    return { received, expected: 2 };
  }

  /** Five sessions in a row, each killed while its transaction only holds a group from GET CONVERSATION GROUP. */
  async function fiveKilledWaiters(name: string) {
    const q = queue(name);
    await openDialog(name, [{ n: 1 }]);
    const groups: (string | null)[] = [];
    for (let i = 0; i < 5; i++) {
      const victim = await beginCallerTransaction(db.url);
      try {
        const [row] = await run<{ GroupId: string | null; TranCount: number; Spid: number }>(
          victim.transaction,
          waitForGroup(q.queue),
          (r) => r.input('timeoutMs', sql.Int, 2_000),
        );
        groups.push(row?.GroupId ?? null);
        await kill(row!.Spid);
      } finally {
        await victim.close();
      }
      await sleep(300);
    }
    return { groups, expected: 1 };
  }

  it('fact 2 (R2-4b): with POISON_MESSAGE_HANDLING OFF, neither five rollbacks of five different messages, nor four of one and one of another, nor five killed sessions that only waited in GET CONVERSATION GROUP disable the queue, and the messages are back (observed: what a queue created ON does, i.e. per queue or per message)', async () => {
    const patterns: [string, string, string, (name: string) => Promise<{ expected: number }>][] = [
      [
        'five rollbacks of five messages (per-queue counting?)',
        Q.perQueueOn,
        Q.perQueueOff,
        fiveRollbacksOfFiveMessages,
      ],
      [
        'four rollbacks of A then one of B (per-message counting?)',
        Q.perMessageOn,
        Q.perMessageOff,
        fourOfOneThenOneOfAnother,
      ],
      ['five killed sessions that only waited (does a wait count?)', Q.waitedOn, Q.waitedOff, fiveKilledWaiters],
    ];
    for (const [what, on, off, pattern] of patterns) {
      if (pattern === fiveKilledWaiters && !perms.alterAnyConnection) {
        console.warn(`server-facts fact 2: "${what}" skipped, the login lacks ALTER ANY CONNECTION (KILL)`);
        continue;
      }
      const [onRun, offRun] = await Promise.all([pattern(on), pattern(off)]);
      const disabled = await watchDisable([on, off], DISABLE_WATCH_MS);
      const observed = {
        what,
        on: { ...onRun, disabledAfterMs: disabled[on], ready: await ready(queue(on).queue) },
        off: { ...offRun, disabledAfterMs: disabled[off], ready: await ready(queue(off).queue) },
      };
      log('fact 2', observed);
      const seen = JSON.stringify(observed);
      expect(disabled[off], `${what}: the OFF queue was disabled: ${seen}`).toBeNull();
      expect(await enabled(off), seen).toBe(1);
      expect(observed.off.ready, `${what}: every message back in the OFF queue: ${seen}`).toBe(offRun.expected);
    }
  }, 180_000);

  // ---- 3 -------------------------------------------------------------------------------------

  it("fact 3: ROLLBACK TRANSACTION to a savepoint inside an mssql Transaction is not a rollback to the driver: commit() resolves, and the initiator reader's give-back (receiveInitiator, giveBackInitiatorMessages) commits with the message back in its queue", async () => {
    const pool = await openMssqlPool(db.url, 1);
    try {
      const transaction = new sql.Transaction(pool);
      let aborted = 0;
      // mssql marks a Transaction aborted (and releases its connection) on tedious's
      // 'rollbackTransaction', which an ENVCHANGE type 10 raises (node_modules/mssql/lib/tedious/transaction.js).
      transaction.on('rollback', () => aborted++);
      await transaction.begin(sql.ISOLATION_LEVEL.READ_COMMITTED);
      const [one] = await run<{ One: number }>(transaction, SAVEPOINT_ROUND_TRIP);
      const inside = await sessionState(transaction);
      const committed = await outcome(within(transaction.commit(), 10_000, 'commit() after a savepoint rollback'));
      const after = await sessionState(pool);
      const observed = {
        one: one?.One,
        tranCountInside: inside.TranCount,
        committed: brief(committed),
        aborted,
        after,
      };
      log('fact 3, savepoint round trip', observed);
      expect(committed.ok, JSON.stringify(observed)).toBe(true);
      expect(aborted, `a 'rollback' event: the server sent ENVCHANGE 10: ${JSON.stringify(observed)}`).toBe(0);
      expect(inside.TranCount, JSON.stringify(observed)).toBe(1);
      expect(after.TranCount, JSON.stringify(observed)).toBe(0);
    } finally {
      await pool.close();
    }

    // The initiator reader's own statements on a reader-pool connection (XACT_ABORT off).
    const q = queue(Q.savepoint);
    const dialog = await openDialog(Q.savepoint, [{ n: 1 }]);
    await run(admin, receiveOfGroup(q.queue), (r) => r.input('group', sql.UniqueIdentifier, dialog.group));
    await run(admin, END_CONVERSATION, (r) => r.input('handle', sql.UniqueIdentifier, dialog.target));
    await waitFor(
      () => ready(q.initiatorQueue),
      (n) => n >= 1,
      { what: 'the EndDialog in the initiator queue' },
    );
    const reader = await new sql.ConnectionPool(
      readerPoolConfig(mssqlPoolConfig(db.url, 1), { readerConnections: 1, requestTimeoutMs: 30_000 }),
    ).connect();
    reader.on('error', () => undefined);
    try {
      const transaction = new sql.Transaction(reader);
      let aborted = 0;
      transaction.on('rollback', () => aborted++);
      await transaction.begin(sql.ISOLATION_LEVEL.READ_COMMITTED);
      const received = await run<{ message_type_name: string }>(transaction, receiveInitiator(q, 10, 1_000));
      await run(transaction, giveBackInitiatorMessages());
      const committed = await outcome(within(transaction.commit(), 10_000, 'commit() after the give-back'));
      const back = await ready(q.initiatorQueue);
      const observed = {
        received: received.map((r) => r.message_type_name),
        committed: brief(committed),
        aborted,
        back,
      };
      log('fact 3, initiator give-back', observed);
      expect(
        received.map((r) => r.message_type_name),
        JSON.stringify(observed),
      ).toContain(BROKER_SYSTEM.END_DIALOG);
      expect(committed.ok, JSON.stringify(observed)).toBe(true);
      expect(aborted, JSON.stringify(observed)).toBe(0);
      expect(back, `the EndDialog is back in the initiator queue: ${JSON.stringify(observed)}`).toBeGreaterThanOrEqual(
        1,
      );
    } finally {
      await reader.close();
    }
  });

  // ---- 4 -------------------------------------------------------------------------------------

  it('fact 4 (R2-2, R2-6): on a connection left with IMPLICIT_TRANSACTIONS ON, the table-free probe and a broker shared-pool batch behind MSSQL_AUTOCOMMIT_SESSION leave @@TRANCOUNT 0 (observed: whether a DMV read opens a transaction)', async () => {
    const pool = await openMssqlPool(db.url, 1);
    try {
      await pool.request().batch(LEAVE_IMPLICIT_TRANSACTIONS);
      const [dmv] = (await pool.request().batch<{ Before: number; DeadlockPriority: number }>(DMV_READ)).recordset;
      const afterDmv = (await pool.request().batch<SessionState>(SESSION_STATE)).recordset[0]!;
      await pool.request().batch(ROLLBACK_LEFTOVER);
      const probe = (await pool.request().batch<SessionState>(SESSION_STATE)).recordset[0]!;
      const probeAgain = (await pool.request().batch<SessionState>(SESSION_STATE)).recordset[0]!;
      const q = queue(Q.wait);
      const health = await outcome(
        run(pool, `${MSSQL_AUTOCOMMIT_SESSION}${readBrokerQueueHealth()}`, (r) =>
          r
            .input('queue', sql.NVarChar(300), quoteBrokerObject(q.queue))
            .input('activationName', sql.NVarChar(128), q.activationNotification),
        ),
      );
      const afterHealth = (await pool.request().batch<SessionState>(SESSION_STATE)).recordset[0]!;
      const observed = {
        dmv,
        dmvOpenedATransaction: afterDmv.TranCount > 0,
        afterDmv,
        probe,
        probeAgain,
        health: brief(health),
        afterHealth,
      };
      log('fact 4', observed);
      const seen = JSON.stringify(observed);
      expect(probe.ImplicitTransactions, seen).toBe(2);
      expect(probeAgain.TranCount, `a table-free SELECT opened a transaction: ${seen}`).toBe(0);
      expect(health.ok, seen).toBe(true);
      expect(afterHealth.TranCount, `a broker shared-pool batch left a transaction: ${seen}`).toBe(0);
    } finally {
      await pool
        .request()
        .batch(ROLLBACK_LEFTOVER)
        .catch(() => undefined);
      await pool.close();
    }
  });

  // ---- 5 -------------------------------------------------------------------------------------

  it("fact 5 (R2-3): lockDialog in an open caller transaction takes the key's application lock and no Range* lock on BrokerDialogs, and the first send of the next key does not wait for it", async () => {
    const tableQueue = newQueue('dialogs');
    for (const key of ['k-1000', 'k-2000']) {
      await run(admin, insertDialogRow(schema), (r) =>
        r.input('queue', sql.NVarChar(128), tableQueue).input('dialogKey', sql.NVarChar(300), key),
      );
    }
    const lockKey = (caller: CallerTransaction, key: string, text = lockDialog(schema)) =>
      run(caller.transaction, text, (r) =>
        r.input('queue', sql.NVarChar(128), tableQueue).input('dialogKey', sql.NVarChar(300), key),
      );
    const t1 = await beginCallerTransaction(db.url);
    const t2 = await beginCallerTransaction(db.url);
    try {
      expect(await lockKey(t1, 'k-1001'), 'no dialog row for k-1001').toEqual([]);
      // k-1002 lies in the gap after k-1001: a key-range lock of T1 would make T2 wait (1222 after 2 s).
      const second = await outcome(lockKey(t2, 'k-1002', withLockTimeout(2_000, lockDialog(schema))));
      let locks: SessionLockRow[] | null = null;
      if (perms.viewServerState) {
        const spid = await t1.spid();
        locks = await run<SessionLockRow>(admin, LOCKS_OF_SESSION, (r) => r.input('spid', sql.Int, spid));
      }
      const observed = { second: brief(second), locks };
      log('fact 5', observed);
      const seen = JSON.stringify(observed);
      expect(second.ok, `T2's lockDialog of k-1002 waited for T1: ${seen}`).toBe(true);
      if (locks) {
        expect(
          locks.filter((l) => l.ResourceType === 'APPLICATION' && l.Mode === 'X'),
          seen,
        ).toHaveLength(1);
        expect(
          locks.filter((l) => l.Object === 'BrokerDialogs' && l.Mode.startsWith('Range')),
          `a key-range lock on BrokerDialogs: ${seen}`,
        ).toEqual([]);
      } else {
        console.warn('server-facts fact 5: lock check skipped, the login lacks VIEW SERVER STATE');
      }
    } finally {
      await Promise.all([t1.close(), t2.close()]);
    }
  });

  // ---- 6 -------------------------------------------------------------------------------------

  it("fact 6 (C4): in a SNAPSHOT caller transaction a READCOMMITTEDLOCK key read sees a key committed after the snapshot began, and the grouped enqueue succeeds after another transaction held or deleted the group's row (observed: 3960 from a raw UPDATE [Groups] WITH (READCOMMITTEDLOCK) of a row changed after the snapshot began)", async ({
    skip,
  }) => {
    if (!db.snapshotIsolation) skip('needs ALLOW_SNAPSHOT_ISOLATION: runs on the RCSI on database only');
    const snapshot = async () => {
      const caller = await beginCallerTransaction(db.url, sql.ISOLATION_LEVEL.SNAPSHOT);
      await run(caller.transaction, startSnapshot(schema)); // the snapshot begins at the first data access
      return caller;
    };
    const claimOne = async (tableQueue: string) => {
      const claimed = await store.claim({
        queue: tableQueue,
        limit: 1,
        leaseMs: 60_000,
        workerId: WORKER,
        groupBatchSize: 1,
      });
      expect(claimed, `a job of ${tableQueue} to claim`).toHaveLength(1);
      return claimed[0]!;
    };
    const observed: Record<string, unknown> = {};

    // (a) the idempotency-key check
    const keyed = newQueue('snap-key');
    const a = await snapshot();
    try {
      const [created] = await store.enqueue([prepareJob(keyed, { n: 1 }, { idempotencyKey: 'k-6' }, LIMITS)]);
      const bind: Bind = (r) => r.input('queue', sql.NVarChar(128), keyed).input('key', sql.NVarChar(255), 'k-6');
      const locking = await run<{ Id: string }>(a.transaction, keyedJobLocking(schema), bind);
      const plain = await run<{ Id: string }>(a.transaction, keyedJobPlain(schema), bind);
      observed.key = { created: created?.jobId, locking, plain };
      expect(
        locking.map((r) => r.Id),
        JSON.stringify(observed),
      ).toEqual([created!.jobId]);
    } finally {
      await a.close();
    }

    // (b) a raw UPDATE of a group row another transaction changed after the snapshot began (observed)
    const raw = newQueue('snap-raw');
    await store.enqueue([prepareJob(raw, { n: 1 }, { groupKey: 'g' }, LIMITS)]);
    const b = await snapshot();
    try {
      await claimOne(raw); // the group row now carries a holder, committed after b's snapshot
      const update = await outcome(
        run<{ Updated: number }>(b.transaction, touchGroupRow(schema), (r) =>
          r.input('queue', sql.NVarChar(128), raw).input('groupKey', sql.NVarChar(255), 'g'),
        ),
      );
      observed.rawUpdate = {
        ...brief(update),
        updateConflict: !update.ok && update.error === SNAPSHOT_UPDATE_CONFLICT,
      };
    } finally {
      await b.close();
    }

    // (c) the store's grouped enqueue into a group another transaction holds
    const held = newQueue('snap-held');
    await store.enqueue([prepareJob(held, { n: 1 }, { groupKey: 'g' }, LIMITS)]);
    const c = await snapshot();
    try {
      await claimOne(held);
      const enqueued = await outcome(
        store.enqueue([prepareJob(held, { n: 2 }, { groupKey: 'g' }, LIMITS)], c.transaction),
      );
      observed.heldGroup = brief(enqueued);
      expect(enqueued.ok, `grouped enqueue in SNAPSHOT after the group was claimed: ${JSON.stringify(observed)}`).toBe(
        true,
      );
      await c.commit();
    } finally {
      await c.close();
    }

    // (d) the store's grouped enqueue into a group whose row another transaction deleted
    const gone = newQueue('snap-gone');
    await store.enqueue([prepareJob(gone, { n: 1 }, { groupKey: 'g' }, LIMITS)]);
    const d = await snapshot();
    try {
      const job = await claimOne(gone);
      await store.complete([{ id: job.id, claimToken: job.claimToken }]);
      const rowBefore = await run(admin, groupRow(schema), (r) =>
        r.input('queue', sql.NVarChar(128), gone).input('groupKey', sql.NVarChar(255), 'g'),
      );
      const enqueued = await outcome(
        store.enqueue([prepareJob(gone, { n: 2 }, { groupKey: 'g' }, LIMITS)], d.transaction),
      );
      observed.deletedGroup = { rowBefore, ...brief(enqueued) };
      expect(
        enqueued.ok,
        `grouped enqueue in SNAPSHOT after the group row was deleted: ${JSON.stringify(observed)}`,
      ).toBe(true);
      await d.commit();
      const next = await store.claim({ queue: gone, limit: 1, leaseMs: 60_000, workerId: WORKER });
      expect(
        next.map((j) => j.payload),
        JSON.stringify(observed),
      ).toEqual([{ n: 2 }]);
    } finally {
      await d.close();
    }
    log('fact 6', observed);
  });

  // ---- 7 -------------------------------------------------------------------------------------

  it("fact 7: ALTER QUEUE and the listener's DROP/CREATE EVENT NOTIFICATION behind an open RECEIVE transaction complete once it ends (observed: whether they wait, their lock modes, and whether a RECEIVE, a NOLOCK read and a SEND queue behind them)", async () => {
    const q = queue(Q.ddl);
    const ddls: [string, string][] = [
      ['ALTER QUEUE … WITH STATUS = ON', brokerEnableQueueStatement(q.queue)],
      ["the listener's DROP + CREATE EVENT NOTIFICATION", brokerEventNotificationBatch(q, options)],
    ];
    for (const [what, text] of ddls) {
      await openDialog(Q.ddl, [{ n: 1 }]);
      await openDialog(Q.ddl, [{ n: 2 }]);
      const reader = await beginCallerTransaction(db.url);
      const ddlPool = await openMssqlPool(db.url, 1);
      try {
        const [held] = await run<{ GroupId: string }>(reader.transaction, receiveNext(q.queue));
        const ddl = track(ddlPool.request().batch(text));
        await sleep(700);
        const whileOpen = {
          ddlWaiting: !ddl.state.settled,
          locks: await queueLocks(Q.ddl),
          reading: await observedLocksReading(Q.ddl),
          receive: brief(await outcome(run(admin, withLockTimeout(PROBE_LOCK_TIMEOUT_MS, receiveNext(q.queue))))),
          nolockRead: brief(await outcome(run(admin, withLockTimeout(PROBE_LOCK_TIMEOUT_MS, readyMessages(q.queue))))),
          send: brief(
            await outcome(
              run(admin, withLockTimeout(PROBE_LOCK_TIMEOUT_MS, sendOnNewDialog(q)), (r) =>
                r.input('body', sql.VarBinary(sql.MAX), bytes({ probe: true })),
              ),
            ),
          ),
        };
        await reader.commit();
        const done = await within(ddl.done, 15_000, `${what} after the reader committed`);
        const observed = { what, readerHeld: held !== undefined, whileOpen, ddl: brief(done) };
        log('fact 7', observed);
        expect(done.ok, `${what} failed: ${JSON.stringify(observed)}`).toBe(true);
      } finally {
        await reader.close();
        await ddlPool.close();
      }
    }
    expect(await enabled(Q.ddl)).toBe(1);
  }, 120_000);

  // ---- 8 -------------------------------------------------------------------------------------

  it("fact 8 (the new receiver never ends with an error): once the target's END CONVERSATION WITH ERROR commits, a SEND on the dialog fails with 8429, an error the sender recovers from (observed: what a SEND racing the uncommitted END does, and where its message goes)", async () => {
    const q = queue(Q.race);
    const dialog = await openDialog(Q.race, [{ n: 1 }]);
    const target = await beginCallerTransaction(db.url);
    const senderPool = await openMssqlPool(db.url, 1);
    const send = (n: number) =>
      run(senderPool, sendOnConversation(q), (r) =>
        r.input('handle', sql.UniqueIdentifier, dialog.initiator).input('body', sql.VarBinary(sql.MAX), bytes({ n })),
      );
    try {
      await run(target.transaction, receiveOfGroup(q.queue), (r) =>
        r.input('group', sql.UniqueIdentifier, dialog.group),
      );
      await run(target.transaction, END_CONVERSATION_WITH_ERROR, (r) =>
        r.input('handle', sql.UniqueIdentifier, dialog.target),
      );
      const racing = track(send(2));
      await sleep(1_000);
      const waitedForTheEnd = !racing.state.settled;
      await target.commit();
      const raced = await outcome(within(racing.done, 15_000, 'the racing SEND'));
      const initiatorState = await waitFor(
        () => endpointsOf(dialog.initiator),
        (rows) => rows.some((e) => e.Initiator === 1 && e.State !== 'CONVERSING'),
        { timeoutMs: 10_000, what: 'the initiator endpoint to see the Error' },
      );
      const [transmission] = await run(admin, TRANSMISSION_QUEUE_OF_CONVERSATION, (r) =>
        r.input('handle', sql.UniqueIdentifier, dialog.initiator),
      );
      const [inTarget] = await run<{ Messages: number }>(admin, messagesOfConversation(q.queue), (r) =>
        r.input('handle', sql.UniqueIdentifier, dialog.target),
      );
      const after = await outcome(send(3));
      const observed = {
        waitedForTheEnd,
        raced: raced.ok ? brief(raced.value) : brief(raced),
        endpoints: initiatorState,
        transmissionQueue: transmission,
        inTargetQueue: inTarget?.Messages,
        sendAfter: brief(after),
      };
      log('fact 8', observed);
      expect(after.ok, JSON.stringify(observed)).toBe(false);
      expect(!after.ok && after.error, JSON.stringify(observed)).toBe(MSSQL_SEND_STATE_ERROR);
      expect(DIALOG_GONE_ERRORS).toContain(MSSQL_SEND_STATE_ERROR);
    } finally {
      await target.close();
      await senderPool.close();
    }
  });

  // ---- 9 -------------------------------------------------------------------------------------

  it("fact 9 (R2-5, the old reader's backoff only; the new receiver never rolls back for a message): after a message was received and rolled back to a savepoint three times, both conversations' messages are still ready and one move takes them into ordered jobs (observed: which group GET CONVERSATION GROUP returns first)", async () => {
    const q = queue(Q.order);
    const first = await openDialog(Q.order, [{ n: 'first' }]);
    const second = await openDialog(Q.order, [{ n: 'second' }]);
    const name = (group: string | null | undefined) =>
      group === first.group ? 'first' : group === second.group ? 'second' : (group ?? null);
    const reader = await beginCallerTransaction(db.url);
    const givenBack: (string | null)[] = [];
    try {
      for (let i = 0; i < 3; i++) {
        const [row] = await run<{ GroupId: string }>(reader.transaction, receiveAndGiveBack(q.queue));
        givenBack.push(name(row?.GroupId));
      }
      await reader.commit();
    } finally {
      await reader.close();
    }
    const [next] = await run<{ GroupId: string | null }>(admin, conversationGroupNow(q.queue));
    const readyBefore = await ready(q.queue);
    const mover = await openMssqlPool(db.url, 1);
    let moved: MoveRow | undefined;
    try {
      [moved] = await run<MoveRow>(mover, moveMessages(schema, q, DEFAULT_MAX_PAYLOAD_BYTES), moveBind(q));
    } finally {
      await mover.close();
    }
    const moveJobs = await jobs(q.name);
    const observed = {
      givenBack,
      getConversationGroupReturns: name(next?.GroupId),
      readyBefore,
      moved,
      jobs: moveJobs.map((j) => name(j.GroupKey)),
    };
    log('fact 9', observed);
    const seen = JSON.stringify(observed);
    expect(readyBefore, seen).toBe(2);
    expect(await enabled(Q.order), seen).toBe(1);
    expect(moved, seen).toMatchObject({ Received: 2, Moved: 2, Ended: 0 });
    expect(moveJobs.map((j) => JSON.stringify(movedBody(j.payload))).sort(), seen).toEqual(
      [{ n: 'first' }, { n: 'second' }].map((b) => JSON.stringify(b)).sort(),
    );
  });

  // ---- 10 ------------------------------------------------------------------------------------

  it('fact 10: the error numbers the sender relies on: SEND on an endpoint the target ended (DI) or ended with an error (ER) is 8429, SEND on an unknown handle or on one we ended is one of DIALOG_GONE_ERRORS, END CONVERSATION on an unknown or already-ended handle succeeds or is 8426 or 8427', async () => {
    const q = queue(Q.errors);
    const errorOf = async (text: string, handle: string, body?: Buffer) => {
      const o = await outcome(
        run(admin, text, (r) => {
          r.input('handle', sql.UniqueIdentifier, handle);
          return body === undefined ? r : r.input('body', sql.VarBinary(sql.MAX), body);
        }),
      );
      return o.ok ? 'ok' : (o.error ?? o.message);
    };
    const endedByTarget = async (withError: boolean) => {
      const dialog = await openDialog(Q.errors, [{ n: 1 }]);
      await run(admin, receiveOfGroup(q.queue), (r) => r.input('group', sql.UniqueIdentifier, dialog.group));
      await run(admin, withError ? END_CONVERSATION_WITH_ERROR : END_CONVERSATION, (r) =>
        r.input('handle', sql.UniqueIdentifier, dialog.target),
      );
      const endpoints = await waitFor(
        () => endpointsOf(dialog.initiator),
        (rows) => rows.some((e) => e.Initiator === 1 && e.State !== 'CONVERSING'),
        { timeoutMs: 10_000, what: 'the initiator endpoint to see the end' },
      );
      return { dialog, state: endpoints.find((e) => e.Initiator === 1)?.State };
    };
    const di = await endedByTarget(false);
    const sendOnDi = await errorOf(sendOnConversation(q), di.dialog.initiator, bytes({ n: 2 }));
    const er = await endedByTarget(true);
    const sendOnEr = await errorOf(sendOnConversation(q), er.dialog.initiator, bytes({ n: 2 }));
    const sendOnUnknown = await errorOf(sendOnConversation(q), randomUUID(), bytes({ n: 2 }));
    const endUnknown = await errorOf(END_CONVERSATION, randomUUID());
    // Our side of the DI dialog, as forgetDialog ends it; then again, and a SEND on it.
    const endDi = await errorOf(END_CONVERSATION, di.dialog.initiator);
    const endDiAgain = await errorOf(END_CONVERSATION, di.dialog.initiator);
    const sendAfterEnd = await errorOf(sendOnConversation(q), di.dialog.initiator, bytes({ n: 3 }));
    // An initiator ending first (the target has not), then ending again.
    const open = await openDialog(Q.errors, [{ n: 1 }]);
    const endOpen = await errorOf(END_CONVERSATION, open.initiator);
    const endOpenAgain = await errorOf(END_CONVERSATION, open.initiator);
    const observed = {
      di: di.state,
      sendOnDi,
      er: er.state,
      sendOnEr,
      sendOnUnknown,
      endUnknown,
      endDi,
      endDiAgain,
      sendAfterEnd,
      endOpen,
      endOpenAgain,
    };
    log('fact 10', observed);
    const seen = JSON.stringify(observed);
    // What endClosedConversation and forgetDialog let pass: success, 8426, 8427 (anything else throws).
    const endTolerated = ['ok', MSSQL_HANDLE_NOT_FOUND, MSSQL_END_STATE_ERROR];
    expect(sendOnDi, seen).toBe(MSSQL_SEND_STATE_ERROR);
    expect(sendOnEr, seen).toBe(MSSQL_SEND_STATE_ERROR);
    expect(DIALOG_GONE_ERRORS, `SEND on an unknown handle: ${seen}`).toContain(sendOnUnknown);
    expect(endTolerated, `END on an unknown handle: ${seen}`).toContain(endUnknown);
    expect(endDi, seen).toBe('ok');
    expect(endTolerated, `END on a handle we ended: ${seen}`).toContain(endDiAgain);
    expect(DIALOG_GONE_ERRORS, `SEND on a handle we ended: ${seen}`).toContain(sendAfterEnd);
    expect(endOpen, seen).toBe('ok');
    expect(endTolerated, `END again on our ended side: ${seen}`).toContain(endOpenAgain);
  });

  // ---- 11 ------------------------------------------------------------------------------------

  it('fact 11 (R2-8): every index of Jobs, Groups and Schedules has page locks off, and no PAGE lock on Jobs or Groups is seen while four claimers drain grouped and ungrouped jobs', async () => {
    const indexes = await run<{ Table: string; Index: string; AllowPageLocks: number }>(
      admin,
      INDEX_LOCK_OPTIONS,
      (r) => r.input('schema', sql.NVarChar(128), schema),
    );
    const queueIndexes = indexes.filter((i) => ['Jobs', 'Groups', 'Schedules'].includes(i.Table));
    expect(queueIndexes.length, JSON.stringify(indexes)).toBeGreaterThan(3);
    expect(
      queueIndexes.filter((i) => i.AllowPageLocks !== 0).map((i) => `${i.Table}.${i.Index}`),
      'indexes with page locks on (migration 10)',
    ).toEqual([]);
    if (!perms.viewServerState) {
      console.warn('server-facts fact 11: PAGE lock sampling skipped, the login lacks VIEW SERVER STATE');
      return;
    }
    const tableQueue = newQueue('pages');
    await store.enqueue(
      Array.from({ length: 400 }, (_, n) =>
        prepareJob(tableQueue, { n }, n % 2 === 0 ? { groupKey: `g-${n % 20}` } : {}, LIMITS),
      ),
    );
    const claimers: QueueStore[] = Array.from({ length: 4 }, () =>
      createMssqlStore({ url: db.url, poolSize: 1 }, { schema }),
    );
    const sampler = await openMssqlPool(db.url, 1);
    const seen = new Map<string, unknown>();
    let samples = 0;
    let sampling = true;
    const sampleLoop = (async () => {
      while (sampling) {
        const rows = await run<Record<string, unknown>>(sampler, PAGE_LOCKS_ON_QUEUE_TABLES, (r) =>
          r.input('schema', sql.NVarChar(128), schema),
        );
        samples++;
        for (const row of rows) seen.set(JSON.stringify(row), row);
        await sleep(25);
      }
    })();
    try {
      await Promise.all(
        claimers.map(async (claimer) => {
          for (let round = 0; round < 500; round++) {
            const claimed = await claimer.claim({
              queue: tableQueue,
              limit: 5,
              leaseMs: 60_000,
              workerId: WORKER,
              groupBatchSize: 5,
            });
            if (claimed.length === 0) {
              if ((await store.stats(tableQueue)).ready === 0) return;
              await sleep(10);
              continue;
            }
            await claimer.complete(claimed.map((j) => ({ id: j.id, claimToken: j.claimToken })));
          }
        }),
      );
    } finally {
      sampling = false;
      await sampleLoop.catch(() => undefined);
      await sampler.close();
      await Promise.all(claimers.map((c) => c.close()));
    }
    const observed = { samples, pageLocks: [...seen.values()], stats: await store.stats(tableQueue) };
    log('fact 11', observed);
    expect(samples, 'sys.dm_tran_locks sampled during the drain').toBeGreaterThan(0);
    expect(observed.pageLocks, JSON.stringify(observed)).toEqual([]);
    expect(observed.stats, JSON.stringify(observed)).toMatchObject({ ready: 0, leased: 0 });
  }, 180_000);

  // ---- 12 ------------------------------------------------------------------------------------

  it("fact 12 (R2-9): a CAST to datetime2(3) rounds .1236 to .124, the enqueue's ENQUEUE_NOW cuts .1236789 to .123, and 2,000 enqueue-then-claim rounds never claim nothing", async () => {
    const [rounded] = await run<{ Stored: string }>(admin, DATETIME2_ROUNDING);
    const enqueueText = mssqlEnqueueInTransaction(schema);
    const enqueueNow = enqueueText.slice(0, enqueueText.indexOf('DECLARE @inserted'));
    expect(enqueueNow, 'mssqlEnqueueInTransaction starts with ENQUEUE_NOW').toMatch(
      /^DECLARE @now datetime2\(7\) = SYSUTCDATETIME\(\);/,
    );
    const [cut] = await run<{ Now: string; Stored: string }>(admin, enqueueNowOnClock(enqueueNow), (r) =>
      r.input('clock', sql.NVarChar(40), '2026-01-01T00:00:00.1236789'),
    );
    const tableQueue = newQueue('tight');
    let empty = 0;
    const emptyRounds: number[] = [];
    for (let round = 0; round < 2_000; round++) {
      await store.enqueue([prepareJob(tableQueue, { round }, {}, LIMITS)]);
      const claimed = await store.claim({ queue: tableQueue, limit: 1, leaseMs: 60_000, workerId: WORKER });
      if (claimed.length === 0) {
        empty++;
        if (emptyRounds.length < 20) emptyRounds.push(round);
        // Leave none behind for the next round's claim.
        await waitFor(
          () => store.claim({ queue: tableQueue, limit: 1, leaseMs: 60_000, workerId: WORKER }),
          (c) => c.length === 1,
          {
            timeoutMs: 5_000,
            what: `the job of round ${round}`,
          },
        );
      }
    }
    const observed = { castStores: rounded?.Stored, enqueueNow: cut, emptyClaims: empty, emptyRounds };
    log('fact 12', observed);
    const seen = JSON.stringify(observed);
    expect(rounded?.Stored, seen).toBe('2026-01-01 00:00:00.124');
    expect(cut, seen).toEqual({ Now: '2026-01-01 00:00:00.1230000', Stored: '2026-01-01 00:00:00.123' });
    expect(empty, `enqueue then claim found nothing: ${seen}`).toBe(0);
  }, 180_000);

  // ---- 13 ------------------------------------------------------------------------------------

  it("fact 13 (the old reader only; a move never RECEIVEs after its END CONVERSATION): after receiving a conversation's message and EndDialog, END CONVERSATION and COMMIT close our side and leave the queue empty (observed: what a RECEIVE of the group after the END returns)", async () => {
    const q = queue(Q.endReceive);
    const dialog = await openDialog(Q.endReceive, [{ n: 1 }]);
    await run(admin, END_CONVERSATION, (r) => r.input('handle', sql.UniqueIdentifier, dialog.initiator));
    await waitFor(
      () => ready(q.queue),
      (n) => n === 2,
      { what: 'the message and the EndDialog' },
    );
    const group: Bind = (r) => r.input('group', sql.UniqueIdentifier, dialog.group);
    const end: Bind = (r) => r.input('handle', sql.UniqueIdentifier, dialog.target);

    // The old reader's order: RECEIVE, END, RECEIVE the group again (rolled back afterwards).
    const old = await beginCallerTransaction(db.url);
    let afterEnd: unknown;
    try {
      const received = await run<{ Type: string }>(old.transaction, receiveOfGroup(q.queue), group);
      await run(old.transaction, END_CONVERSATION, end);
      const again = await outcome(run(old.transaction, receiveGroupAfterEnd(q.queue), group));
      afterEnd = { received: received.map((r) => r.Type), receiveAfterEnd: again.ok ? again.value[0] : brief(again) };
    } finally {
      await old.close();
    }

    // The move's order: RECEIVE, END, COMMIT.
    const move = await beginCallerTransaction(db.url);
    let received: { Type: string }[];
    try {
      received = await run<{ Type: string }>(move.transaction, receiveOfGroup(q.queue), group);
      await run(move.transaction, END_CONVERSATION, end);
      await move.commit();
    } finally {
      await move.close();
    }
    const endpoints = await endpointsOf(dialog.target);
    const observed = {
      old: afterEnd,
      moveReceived: received.map((r) => r.Type),
      endpoints,
      ready: await ready(q.queue),
    };
    log('fact 13', observed);
    const seen = JSON.stringify(observed);
    expect(
      received.map((r) => r.Type),
      seen,
    ).toEqual([q.messageType, BROKER_SYSTEM.END_DIALOG]);
    expect(
      endpoints.filter((e) => e.Initiator === 0 && e.State !== 'CLOSED'),
      seen,
    ).toEqual([]);
    expect(observed.ready, seen).toBe(0);
  });

  // ---- 14 ------------------------------------------------------------------------------------

  it('fact 14: QUEUE_ACTIVATION while a message waits and no one consumes the queue: at least one notification within 15 s, never two within a second of each other (observed: the count, the gaps, the rate per hour)', async () => {
    const q = queue(Q.activation);
    const receiveTimes = (timeoutMs: number) =>
      run<{
        Type: string;
        EventType: string | null;
        SchemaName: string | null;
        ObjectName: string | null;
        EnqueuedMs: string | null;
      }>(admin, receiveNotificationTimes(options.notificationQueue), (r) =>
        r
          .input('timeoutMs', sql.Int, timeoutMs)
          .input('eventNotificationType', sql.NVarChar(256), BROKER_SYSTEM.EVENT_NOTIFICATION),
      );
    // What earlier experiments left in the shared notification queue.
    let drained = 0;
    while (drained < 50 && (await receiveTimes(200)).length > 0) drained++;
    const start = Date.now();
    await openDialog(Q.activation, [{ n: 1 }]);
    const times: number[] = [];
    const windowMs = 15_000;
    while (Date.now() - start < windowMs) {
      for (const row of await receiveTimes(1_000)) {
        if (
          row.EventType === 'QUEUE_ACTIVATION' &&
          row.SchemaName === q.queue.schema &&
          row.ObjectName === q.queue.name
        ) {
          times.push(Number(row.EnqueuedMs));
        }
      }
    }
    times.sort((x, y) => x - y);
    const gaps = times.slice(1).map((t, i) => t - times[i]!);
    const observed = {
      windowMs,
      notifications: times.length,
      gapsMs: gaps,
      perHourAtThisRate: Math.round((times.length / windowMs) * 3_600_000),
      stillWaiting: await ready(q.queue),
    };
    log('fact 14', observed);
    const seen = JSON.stringify(observed);
    expect(times.length, `no QUEUE_ACTIVATION: ${seen}`).toBeGreaterThanOrEqual(1);
    expect(
      gaps.filter((g) => g < 1_000),
      `notifications within a second of each other: ${seen}`,
    ).toEqual([]);
  }, 60_000);

  // ---- a -------------------------------------------------------------------------------------

  it('new design a: WAITFOR (GET CONVERSATION GROUP) in autocommit returns the group, leaves @@TRANCOUNT 0 and holds no lock, so another session RECEIVEs that group at once; waitForMessages answers Ready 1, and Ready 0 after its timeout on an empty queue', async () => {
    const q = queue(Q.wait);
    const waiter = await openMssqlPool(db.url, 1);
    try {
      const idleWait = track(
        run<{ Ready: number }>(waiter, waitForMessages(q.queue), (r) => r.input('timeoutMs', sql.Int, 3_000)),
      );
      await sleep(500);
      // What an idle receiver holds while it waits (the health reading's holder, fact j).
      const whileWaiting = {
        locks: await queueLocks(Q.wait),
        reading: await observedLocksReading(Q.wait),
      };
      const idle = await idleWait.done;
      const dialog = await openDialog(Q.wait, [{ n: 1 }]);
      const [readyRow] = await run<{ Ready: number }>(waiter, waitForMessages(q.queue), (r) =>
        r.input('timeoutMs', sql.Int, 5_000),
      );
      const afterReady = await sessionState(waiter);
      const [group] = await run<{ GroupId: string | null; TranCount: number }>(waiter, waitForGroup(q.queue), (r) =>
        r.input('timeoutMs', sql.Int, 5_000),
      );
      const other = await outcome(
        run<{ Handle: string }>(admin, withLockTimeout(2_000, receiveOfGroup(q.queue)), (r) =>
          r.input('group', sql.UniqueIdentifier, group?.GroupId ?? dialog.group),
        ),
      );
      const empty = await outcome(
        run<{ Ready: number }>(waiter, waitForMessages(q.queue), (r) => r.input('timeoutMs', sql.Int, 300)),
      );
      const observed = {
        whileWaiting,
        idle: idle.ok ? { ready: idle.value[0]?.Ready, ms: idle.ms } : brief(idle),
        ready: readyRow?.Ready,
        afterReady,
        group,
        otherSessionReceives: other.ok ? { rows: other.value.length, ms: other.ms } : brief(other),
        empty: empty.ok ? { ready: empty.value[0]?.Ready, ms: empty.ms } : brief(empty),
      };
      log('new design a', observed);
      const seen = JSON.stringify(observed);
      expect(Number(readyRow?.Ready), seen).toBe(1);
      expect(afterReady.TranCount, seen).toBe(0);
      expect(group, seen).toMatchObject({ GroupId: dialog.group, TranCount: 0 });
      expect(other.ok && other.value.length, `another session could not RECEIVE the group at once: ${seen}`).toBe(1);
      expect(empty.ok && Number(empty.value[0]?.Ready), seen).toBe(0);
      expect(empty.ms, seen).toBeGreaterThanOrEqual(250);
    } finally {
      await waiter.close();
    }
  });

  // ---- b -------------------------------------------------------------------------------------

  it('new design b: RECEIVE TOP (n) INTO a table variable without WAITFOR returns at once on an empty queue, takes one conversation group per RECEIVE, and a second RECEIVE appends to the same table variable (how moveMessages counts @received)', async () => {
    const q = queue(Q.into);
    const pool = await openMssqlPool(db.url, 1);
    try {
      const [empty] = await run<Record<string, number>>(pool, receiveTwiceInto(q.queue, 10));
      await openDialog(Q.into, [{ n: 1 }, { n: 2 }, { n: 3 }]);
      await openDialog(Q.into, [{ n: 4 }, { n: 5 }]);
      const [full] = await run<Record<string, number>>(pool, receiveTwiceInto(q.queue, 10));
      const observed = { empty, full };
      log('new design b', observed);
      const seen = JSON.stringify(observed);
      expect(empty, seen).toMatchObject({ AfterFirst: 0, AfterSecond: 0, TranCount: 0 });
      expect(empty!.ElapsedMs, `RECEIVE without WAITFOR waited on an empty queue: ${seen}`).toBeLessThan(1_000);
      expect(full!.FirstGroups, `one RECEIVE, one conversation group: ${seen}`).toBe(1);
      expect([2, 3], seen).toContain(full!.AfterFirst);
      expect(full!.AfterSecond, `the second RECEIVE INTO appends: ${seen}`).toBe(5);
      expect(full!.Groups, seen).toBe(2);
      expect(full!.TranCount, seen).toBe(0);
    } finally {
      await pool.close();
    }
  });

  // ---- c -------------------------------------------------------------------------------------

  it('new design c: moveMessages compiles and runs on an empty queue (RECEIVE … INTO accepts its @received), answering Received 0, Moved 0, Ended 0 with @@TRANCOUNT 0 after; a table variable one column short is refused', async () => {
    const q = queue(Q.types);
    const pool = await openMssqlPool(db.url, 1);
    try {
      const moved = await outcome(run<MoveRow>(pool, moveMessages(schema, q, DEFAULT_MAX_PAYLOAD_BYTES), moveBind(q)));
      const after = await sessionState(pool);
      const short = await outcome(run(pool, receiveIntoTooFewColumns(q.queue)));
      const observed = { moved: moved.ok ? moved.value : brief(moved), after, short: brief(short) };
      log('new design c', observed);
      const seen = JSON.stringify(observed);
      expect(moved.ok && moved.value, seen).toEqual([{ Received: 0, Moved: 0, Ended: 0, Errors: null }]);
      expect(after.TranCount, seen).toBe(0);
      expect(short.ok, `a 4-column table variable took a 5-column RECEIVE: ${seen}`).toBe(false);
    } finally {
      await pool.close();
    }
  });

  // ---- d -------------------------------------------------------------------------------------

  it('new design d: FOR JSON PATH, WITHOUT_ARRAY_WRAPPER in a scalar subquery encodes varbinary as base64 and leaves NULLs out, CONVERT(nvarchar(36), uniqueidentifier) is upper case, and a move carries a JSON body sent as UTF-16LE as its text and raw bytes as base64', async () => {
    const guid = randomUUID();
    const raw = Buffer.from([0x00, 0xff, 0x10, 0x80, 0x7f]);
    const text = JSON.stringify({ s: 'héllo ✓ "quoted"', n: 1 });
    const [probe] = await run<{ Json: string; GuidText: string; Text: string }>(admin, FOR_JSON_PROBE, (r) =>
      r
        .input('bytes', sql.VarBinary(sql.MAX), raw)
        .input('guid', sql.UniqueIdentifier, guid)
        .input('utf16', sql.VarBinary(sql.MAX), Buffer.from(text, 'utf16le')),
    );
    const json = JSON.parse(probe!.Json) as Record<string, unknown>;

    const q = queue(Q.json);
    const jsonBody = { order: 42, note: 'ünïcödé ✓', nested: { list: [1, 2, 3] } };
    const dialog = await openDialog(Q.json, [jsonBody, raw]);
    const mover = await openMssqlPool(db.url, 1);
    let moved: MoveRow | undefined;
    try {
      [moved] = await run<MoveRow>(mover, moveMessages(schema, q, DEFAULT_MAX_PAYLOAD_BYTES), moveBind(q));
    } finally {
      await mover.close();
    }
    const moveJobs = await jobs(q.name);
    const observed = { probe, moved, payloads: moveJobs.map((j) => j.payload) };
    log('new design d', observed);
    const seen = JSON.stringify(observed);
    expect(json, seen).toEqual({ body: raw.toString('base64'), guid: guid.toUpperCase() });
    expect(probe!.GuidText, seen).toBe(guid.toUpperCase());
    expect(probe!.Text, seen).toBe(text);
    expect(moved, seen).toMatchObject({ Received: 2, Moved: 2, Ended: 0 });
    const [first, second] = moveJobs;
    expect(first!.payload, seen).toMatchObject({
      type: q.messageType,
      conversationHandle: dialog.target,
      conversationGroupId: dialog.group,
    });
    expect(first!.payload.body, seen).toBeUndefined();
    expect(first!.payload.droppedBytes, seen).toBeUndefined();
    expect(movedBody(first!.payload), seen).toEqual(jsonBody);
    expect(second!.payload.text, seen).toBeUndefined();
    expect(second!.payload.body, seen).toBe(raw.toString('base64'));
    expect(brokerJobBytes(second!.payload), seen).toEqual(raw);
    expect(BigInt(second!.payload.sequence) > BigInt(first!.payload.sequence), seen).toBe(true);
  });

  // ---- e -------------------------------------------------------------------------------------

  it('new design e: one moveMessages batch moves two conversations and an EndDialog into ordered jobs, ends that conversation and empties the queue; when its enqueue cannot get a lock it throws, leaves @@TRANCOUNT 0, gives the messages back and enqueues nothing', async () => {
    const q = queue(Q.move);
    const a = await openDialog(Q.move, [{ a: 1 }, { a: 2 }]);
    const b = await openDialog(Q.move, [{ b: 1 }]);
    await run(admin, END_CONVERSATION, (r) => r.input('handle', sql.UniqueIdentifier, b.initiator));
    await waitFor(
      () => ready(q.queue),
      (n) => n === 4,
      { what: 'three messages and an EndDialog' },
    );
    const mover = await openMssqlPool(db.url, 1);
    try {
      // The failure: an exclusive table lock on Jobs makes the enqueue's INSERT wait past the
      // move's own LOCK_TIMEOUT (BROKER_MOVE_LOCK_TIMEOUT_MS): 1222, caught by the move.
      const holder = await beginCallerTransaction(db.url);
      let failed: Outcome<MoveRow[]>;
      let afterFailure: SessionState;
      let readyAfterFailure: number;
      try {
        await run(holder.transaction, holdJobsTable(schema));
        failed = await outcome(run<MoveRow>(mover, moveMessages(schema, q, DEFAULT_MAX_PAYLOAD_BYTES), moveBind(q)));
        afterFailure = await sessionState(mover);
        readyAfterFailure = await ready(q.queue);
      } finally {
        await holder.close();
      }
      const jobsAfterFailure = await jobs(q.name);
      const failure = {
        move: brief(failed),
        afterFailure,
        readyAfterFailure,
        jobsAfterFailure: jobsAfterFailure.length,
        enabled: await enabled(Q.move),
      };
      log('new design e, failing move', failure);
      const failureSeen = JSON.stringify(failure);
      expect(failed.ok, `the move did not throw: ${failureSeen}`).toBe(false);
      expect(afterFailure.TranCount, failureSeen).toBe(0);
      expect(readyAfterFailure, `the messages are back: ${failureSeen}`).toBe(4);
      expect(jobsAfterFailure, failureSeen).toEqual([]);
      expect(failure.enabled, failureSeen).toBe(1);

      const [moved] = await run<MoveRow>(mover, moveMessages(schema, q, DEFAULT_MAX_PAYLOAD_BYTES), moveBind(q));
      const after = await sessionState(mover);
      const moveJobs = await jobs(q.name);
      const byGroup = (group: string) =>
        moveJobs
          .filter((j) => j.GroupKey === group)
          .map((j) => ({ id: BigInt(j.Id), sequence: BigInt(j.payload.sequence), body: movedBody(j.payload), j }));
      const ofA = byGroup(a.group);
      const ofB = byGroup(b.group);
      const observed = {
        moved,
        after,
        jobs: moveJobs.map((j) => ({ id: j.Id, state: j.State, groupKey: j.GroupKey, payload: j.payload })),
        endpointsB: await endpointsOf(b.target),
        endpointsA: await endpointsOf(a.target),
        ready: await ready(q.queue),
      };
      log('new design e, move', observed);
      const seen = JSON.stringify(observed);
      expect(moved, seen).toEqual({ Received: 4, Moved: 3, Ended: 1, Errors: null });
      expect(after.TranCount, seen).toBe(0);
      expect(
        ofA.map((x) => x.body),
        seen,
      ).toEqual([{ a: 1 }, { a: 2 }]);
      expect(
        ofB.map((x) => x.body),
        seen,
      ).toEqual([{ b: 1 }]);
      expect(ofA[0]!.id < ofA[1]!.id && ofA[0]!.sequence < ofA[1]!.sequence, `conversation order: ${seen}`).toBe(true);
      for (const x of [...ofA, ...ofB]) {
        expect(x.j.State, seen).toBe('ready');
        expect(x.j.payload.type, seen).toBe(q.messageType);
      }
      expect(
        ofA.every((x) => x.j.payload.conversationHandle === a.target),
        seen,
      ).toBe(true);
      expect(
        ofB.every((x) => x.j.payload.conversationHandle === b.target),
        seen,
      ).toBe(true);
      expect(
        observed.endpointsB.filter((e) => e.Initiator === 0 && e.State !== 'CLOSED'),
        seen,
      ).toEqual([]);
      expect(observed.endpointsA.find((e) => e.Initiator === 0)?.State, seen).toBe('CONVERSING');
      expect(observed.ready, seen).toBe(0);
    } finally {
      await mover.close();
    }
  }, 60_000);

  // ---- f -------------------------------------------------------------------------------------

  it("new design f: cancelling a receiver's autocommit wait through the driver (a TDS attention) rejects as cancelled and leaves @@TRANCOUNT 0 on that connection", async () => {
    const q = queue(Q.cancel);
    const driver = await createMssqlBrokerDriver(store, { readerConnections: 1, requestTimeoutMs: 30_000 });
    const connection = await driver.openConnection();
    try {
      const [before] = await connection.query<SessionState>(SESSION_STATE);
      const waiting = outcome(
        connection.query(waitForMessages(q.queue), { timeoutMs: { type: 'int', value: 20_000 } }),
      );
      await sleep(500);
      connection.cancel();
      const cancelled = await waiting;
      const [after] = await connection.query<SessionState>(SESSION_STATE);
      const observed = {
        before,
        cancelled: brief(cancelled),
        isCancelled: !cancelled.ok && driver.isCancelled(cancelled.cause),
        after,
      };
      log('new design f', observed);
      const seen = JSON.stringify(observed);
      expect(cancelled.ok, seen).toBe(false);
      expect(observed.isCancelled, seen).toBe(true);
      expect(cancelled.ms, `the attention was not honoured at once: ${seen}`).toBeLessThan(5_000);
      expect(after!.Spid, `the same connection: ${seen}`).toBe(before!.Spid);
      expect(after!.TranCount, seen).toBe(0);
    } finally {
      await connection.close();
      await driver.close();
    }
  });

  // ---- g -------------------------------------------------------------------------------------

  /** Five sessions in a row receive the queue's one message in a transaction and are killed; each time the message must come back. */
  async function fiveKillsAfterReceive(name: string) {
    const q = queue(name);
    await openDialog(name, [{ n: 1 }]);
    const rounds: Record<string, unknown>[] = [];
    for (let i = 0; i < 5; i++) {
      const victim = await beginCallerTransaction(db.url);
      try {
        const received = await outcome(run(victim.transaction, receiveNext(q.queue)));
        if (!received.ok) {
          rounds.push({ received: brief(received) });
          break;
        }
        const spid = await victim.spid();
        await kill(spid);
        const back = await outcome(
          waitFor(
            () => ready(q.queue),
            (n) => n === 1,
            { timeoutMs: 10_000, what: `the message back in ${name}` },
          ),
        );
        rounds.push({ received: received.value.length, back: brief(back) });
      } finally {
        await victim.close();
      }
    }
    return rounds;
  }

  it('new design g: five sessions killed in a row mid-transaction after RECEIVE: the message comes back each time, and a queue with POISON_MESSAGE_HANDLING OFF stays enabled (observed: a queue created ON)', async ({
    skip,
  }) => {
    if (!perms.alterAnyConnection) skip('the login lacks ALTER ANY CONNECTION, which KILL needs');
    const [on, off] = await Promise.all([fiveKillsAfterReceive(Q.killOn), fiveKillsAfterReceive(Q.killOff)]);
    const disabled = await watchDisable([Q.killOn, Q.killOff], DISABLE_WATCH_MS);
    const observed = {
      on: { rounds: on, disabledAfterMs: disabled[Q.killOn] },
      off: { rounds: off, disabledAfterMs: disabled[Q.killOff] },
    };
    log('new design g', observed);
    const seen = JSON.stringify(observed);
    expect(off, seen).toHaveLength(5);
    for (const round of off) expect(round, seen).toMatchObject({ received: 1, back: { ok: true } });
    expect(disabled[Q.killOff], `the OFF queue was disabled: ${seen}`).toBeNull();
    expect(await enabled(Q.killOff), seen).toBe(1);
    expect(await ready(queue(Q.killOff).queue), seen).toBe(1);
  }, 120_000);

  // ---- h -------------------------------------------------------------------------------------

  it('new design h: END CONVERSATION on a handle we already ended raises 8426 or 8427 (or succeeds), and endClosedConversation tolerates it (and an unknown handle)', async () => {
    const q = queue(Q.endTwice);
    const dialog = await openDialog(Q.endTwice, [{ n: 1 }]);
    await run(admin, receiveOfGroup(q.queue), (r) => r.input('group', sql.UniqueIdentifier, dialog.group));
    const end = (text: string, handle: string) =>
      outcome(run(admin, text, (r) => r.input('handle', sql.UniqueIdentifier, handle)));
    const first = await end(END_CONVERSATION, dialog.target);
    const again = await end(END_CONVERSATION, dialog.target);
    const tolerated = await end(endClosedConversation(), dialog.target);
    const unknown = await end(endClosedConversation(), randomUUID());
    const observed = { first: brief(first), again: brief(again), tolerated: brief(tolerated), unknown: brief(unknown) };
    log('new design h', observed);
    const seen = JSON.stringify(observed);
    expect(first.ok, seen).toBe(true);
    expect(again.ok || [MSSQL_HANDLE_NOT_FOUND, MSSQL_END_STATE_ERROR].includes(again.error ?? 0), seen).toBe(true);
    expect(tolerated.ok, seen).toBe(true);
    expect(unknown.ok, seen).toBe(true);
  });

  // ---- i -------------------------------------------------------------------------------------

  it("new design i: a broker transaction (driver.begin(): an mssql Transaction on the shared pool) on a connection an application left with IMPLICIT_TRANSACTIONS ON either runs at @@TRANCOUNT 1 or is refused by the own-transaction guard; either way nothing is left open after it, and the next shared-pool batch passes its guard (observed: whether tedious's begin request nests under implicit mode)", async () => {
    const pool = await openMssqlPool(db.url, 1);
    const shared = createMssqlStore({ pool }, { schema });
    const driver = await createMssqlBrokerDriver(shared, { readerConnections: 1, requestTimeoutMs: 30_000 });
    try {
      await pool.request().batch(LEAVE_IMPLICIT_TRANSACTIONS);
      const before = (await pool.request().batch<SessionState>(SESSION_STATE)).recordset[0]!;
      const session = await driver.begin();
      // The first statement carries MSSQL_OWN_TRANSACTION_GUARD (the driver adds it).
      const inside = await outcome(session.query<SessionState>(SESSION_STATE));
      const ended = inside.ok
        ? await outcome(session.query(countDialogs(schema)).then(() => session.commit()))
        : await outcome(session.rollback());
      const after = (await pool.request().batch<SessionState>(SESSION_STATE)).recordset[0]!;
      const q = queue(Q.wait);
      const next = await outcome(
        driver.query(readBrokerQueueHealth(), {
          queue: { type: 'nvarchar', value: quoteBrokerObject(q.queue) },
          activationName: { type: 'nvarchar', value: q.activationNotification },
        }),
      );
      const observed = {
        before,
        inside: inside.ok ? inside.value : brief(inside),
        ended: brief(ended),
        after,
        nextSharedBatch: brief(next),
      };
      log('new design i', observed);
      const seen = JSON.stringify(observed);
      expect(before, seen).toMatchObject({ TranCount: 0, ImplicitTransactions: 2 });
      if (inside.ok) expect(inside.value[0], seen).toMatchObject({ TranCount: 1 });
      else {
        expect(inside.cause, seen).toBeInstanceOf(SqlQueueTransactionError);
        expect(mssqlErrorNumber((inside.cause as Error).cause), seen).toBe(MSSQL_NESTED_OWN_TRANSACTION);
      }
      expect(ended.ok, seen).toBe(true);
      expect(after.TranCount, `a transaction left open after the session: ${seen}`).toBe(0);
      expect(next.ok, seen).toBe(true);
    } finally {
      await driver.close();
      await shared.close();
      await pool
        .request()
        .batch(ROLLBACK_LEFTOVER)
        .catch(() => undefined);
      await pool.close();
    }
  });

  // ---- j -------------------------------------------------------------------------------------

  it("new design j: while ALTER QUEUE waits behind an open RECEIVE transaction, readBrokerQueueLocks (the health reading) reports a Sch-M waiter on the queue and that transaction's session as the holder", async ({
    skip,
  }) => {
    if (!perms.viewServerState) skip('the login lacks VIEW SERVER STATE: sys.dm_tran_locks shows only its own session');
    const q = queue(Q.schemaLock);
    await openDialog(Q.schemaLock, [{ n: 1 }]);
    const reader = await beginCallerTransaction(db.url);
    const alterPool = await openMssqlPool(db.url, 1);
    try {
      const [held] = await run(reader.transaction, receiveNext(q.queue));
      const spid = await reader.spid();
      const alter = track(alterPool.request().batch(brokerEnableQueueStatement(q.queue)));
      const reading = await outcome(
        waitFor(
          () => locksReading(Q.schemaLock),
          (r) => Number(r.SchemaLockWaiters) >= 1,
          {
            timeoutMs: 5_000,
            what: 'a Sch-M waiter on the queue',
          },
        ),
      );
      const locks = await queueLocks(Q.schemaLock);
      await reader.commit();
      const done = await within(alter.done, 15_000, 'ALTER QUEUE after the reader committed');
      const afterCommit = await locksReading(Q.schemaLock);
      const observed = {
        readerHeld: held !== undefined,
        readerSpid: spid,
        reading: reading.ok ? reading.value : brief(reading),
        locks,
        alter: brief(done),
        afterCommit,
      };
      log('new design j', observed);
      const seen = JSON.stringify(observed);
      expect(reading.ok, `no Sch-M waiter seen: ${seen}`).toBe(true);
      expect(reading.ok && reading.value.HolderSession, seen).toBe(spid);
      expect(reading.ok && Number(reading.value.HolderAgeMs), seen).toBeGreaterThanOrEqual(0);
      expect(done.ok, seen).toBe(true);
      expect(Number(afterCommit.SchemaLockWaiters), seen).toBe(0);
    } finally {
      await reader.close();
      await alterPool.close();
    }
  });

  // ---- k -------------------------------------------------------------------------------------

  /**
   * The states of a target endpoint that ended before the initiator did: DISCONNECTED_OUTBOUND
   * ("The local side of the conversation has issued an END CONVERSATION") until the initiator's
   * side acknowledges it, then CLOSED (sys.conversation_endpoints); or the row is gone.
   */
  const ENDED_FIRST = ['DISCONNECTED_OUTBOUND', 'CLOSED'];

  /** Messages of conversation `handle` (the target's) still in queue `name`, whatever their status. */
  async function inQueueOf(name: string, handle: string): Promise<number> {
    const [row] = await run<{ Messages: number }>(admin, messagesOfConversation(queue(name).queue), (r) =>
      r.input('handle', sql.UniqueIdentifier, handle),
    );
    return Number(row?.Messages ?? 0);
  }

  async function queuedOf(name: string, handle: string): Promise<QueuedMessage[]> {
    return run<QueuedMessage>(admin, queuedMessagesOfConversation(queue(name).queue), (r) =>
      r.input('handle', sql.UniqueIdentifier, handle),
    );
  }

  it("new design k: END CONVERSATION in a transaction deletes the conversation's messages not received yet: after RECEIVE TOP (1) of three, END CONVERSATION and COMMIT, the queue holds none of that conversation (why moveMessages RECEIVEs the rest of an ended conversation before it ends it)", async () => {
    const q = queue(Q.endDrops);
    const dialog = await openDialog(Q.endDrops, [{ n: 1 }, { n: 2 }, { n: 3 }]);
    const ofTarget: Bind = (r) => r.input('handle', sql.UniqueIdentifier, dialog.target);
    await waitFor(
      () => inQueueOf(Q.endDrops, dialog.target),
      (n) => n === 3,
      { what: 'the three messages in the target queue' },
    );
    const before = await queuedOf(Q.endDrops, dialog.target);
    const mover = await beginCallerTransaction(db.url);
    let received: QueuedMessage[];
    let committed: Outcome<void>;
    try {
      received = await run<QueuedMessage>(mover.transaction, receiveFirstOfConversation(q.queue), ofTarget);
      await run(mover.transaction, END_CONVERSATION, ofTarget);
      committed = await outcome(mover.commit());
    } finally {
      await mover.close();
    }
    const observed = {
      before,
      received,
      committed: brief(committed),
      left: await queuedOf(Q.endDrops, dialog.target),
      endpoints: await endpointsOf(dialog.target),
    };
    log('new design k', observed);
    const seen = JSON.stringify(observed);
    expect(
      before.map((m) => m.Type),
      seen,
    ).toEqual([q.messageType, q.messageType, q.messageType]);
    expect(
      received.map((m) => m.Type),
      seen,
    ).toEqual([q.messageType]);
    expect(committed.ok, seen).toBe(true);
    expect(observed.left, `END CONVERSATION left messages of the conversation in the queue: ${seen}`).toEqual([]);
    expect(
      observed.endpoints.filter((e) => e.Initiator === 0 && !ENDED_FIRST.includes(e.State)),
      `our side is not ended: ${seen}`,
    ).toEqual([]);
  });

  // ---- l -------------------------------------------------------------------------------------

  it('new design l: on a conversation its initiator ended WITH ERROR after three messages, moves of one message each (messagesPerTransaction 1) take the three into ready jobs of one group in sequence order, end our side and leave the queue empty (observed: the sequence number the server gave the Error, and what each move answered)', async () => {
    // moveMessages reads messagesPerTransaction from the resolved queue, as a queue declared with
    // messagesPerTransaction: 1 resolves; the Service Broker objects are the scratch queue's.
    const q: ResolvedBrokerQueue = { ...queue(Q.errorEnd), messagesPerTransaction: 1 };
    const dialog = await openDialog(Q.errorEnd, [{ n: 1 }, { n: 2 }, { n: 3 }]);
    // END CONVERSATION WITH ERROR "drops any other messages for this conversation currently in
    // the transmission queue": all three must be in the target queue first.
    await waitFor(
      () => inQueueOf(Q.errorEnd, dialog.target),
      (n) => n === 3,
      { what: 'the three messages in the target queue' },
    );
    await run(admin, END_CONVERSATION_WITH_ERROR, (r) => r.input('handle', sql.UniqueIdentifier, dialog.initiator));
    await waitFor(
      () => inQueueOf(Q.errorEnd, dialog.target),
      (n) => n === 4,
      { what: 'the Error after the three messages' },
    );
    const queued = await queuedOf(Q.errorEnd, dialog.target);
    const error = queued.find((m) => m.Type === BROKER_SYSTEM.ERROR);
    const sequences = queued.filter((m) => m.Type === q.messageType).map((m) => BigInt(m.Sequence));
    const mover = await openMssqlPool(db.url, 1);
    const moves: MoveRow[] = [];
    try {
      // Four messages, one a move: five moves at most, the last one empty (ten: room to observe more).
      for (let i = 0; i < 10; i++) {
        const [moved] = await run<MoveRow>(mover, moveMessages(schema, q, DEFAULT_MAX_PAYLOAD_BYTES), moveBind(q));
        moves.push(moved!);
        if (Number(moved!.Received) === 0) break;
      }
    } finally {
      await mover.close();
    }
    const moveJobs = await jobs(q.name);
    const observed = {
      queued,
      errorSequence: error?.Sequence ?? null,
      errorAfterEveryMessage: error ? sequences.every((s) => BigInt(error.Sequence) > s) : null,
      moves,
      jobs: moveJobs.map((j) => ({
        id: j.Id,
        state: j.State,
        groupKey: j.GroupKey,
        sequence: j.payload.sequence,
        body: movedBody(j.payload),
      })),
      endpoints: await endpointsOf(dialog.target),
      left: await queuedOf(Q.errorEnd, dialog.target),
    };
    log('new design l', observed);
    const seen = JSON.stringify(observed);
    expect(error, `no Error message in the target queue: ${seen}`).toBeDefined();
    expect(sequences, seen).toHaveLength(3);
    expect(Number(moves[moves.length - 1]!.Received), `still receiving after ten moves: ${seen}`).toBe(0);
    expect(
      moves.reduce((n, m) => n + Number(m.Moved), 0),
      seen,
    ).toBe(3);
    expect(
      moves.reduce((n, m) => n + Number(m.Ended), 0),
      seen,
    ).toBe(1);
    expect(
      moveJobs.map((j) => movedBody(j.payload)),
      seen,
    ).toEqual([{ n: 1 }, { n: 2 }, { n: 3 }]);
    const jobSequences = moveJobs.map((j) => BigInt(j.payload.sequence));
    expect(
      jobSequences.every((s, i) => i === 0 || s > jobSequences[i - 1]!),
      `jobs (in id order) out of sequence order: ${seen}`,
    ).toBe(true);
    for (const j of moveJobs) {
      expect(j.State, seen).toBe('ready');
      expect(j.GroupKey, `one group, the conversation group's: ${seen}`).toBe(dialog.group);
      expect(j.payload.type, seen).toBe(q.messageType);
      expect(j.payload.conversationHandle, seen).toBe(dialog.target);
    }
    expect(
      observed.endpoints.filter((e) => e.Initiator === 0 && e.State !== 'CLOSED'),
      `our side is not ended: ${seen}`,
    ).toEqual([]);
    expect(observed.left, seen).toEqual([]);
  }, 60_000);

  // ---- m -------------------------------------------------------------------------------------

  it('new design m: in a transaction, END CONVERSATION in TRY/CATCH on a handle that never existed raises 8426 or 8427 and leaves XACT_STATE() 1 (as does ending again one it ended, if that raises at all), so a move tolerates it and goes on; the transaction then commits', async () => {
    const q = queue(Q.endInTransaction);
    const dialog = await openDialog(Q.endInTransaction, [{ n: 1 }]);
    const caller = await beginCallerTransaction(db.url);
    let inside: Outcome<EndInTransactionRow[]>;
    let committed: Outcome<void> | null = null;
    try {
      inside = await outcome(
        run<EndInTransactionRow>(caller.transaction, END_AGAIN_AND_UNKNOWN_IN_TRANSACTION, (r) =>
          r.input('handle', sql.UniqueIdentifier, dialog.target),
        ),
      );
      if (inside.ok) committed = await outcome(caller.commit());
    } finally {
      await caller.close();
    }
    const row = inside.ok ? inside.value[0] : undefined;
    const observed = {
      inside: inside.ok ? row : brief(inside),
      committed: committed ? brief(committed) : null,
      endpoints: await endpointsOf(dialog.target),
      left: await queuedOf(Q.endInTransaction, dialog.target),
      ready: await ready(q.queue),
    };
    log('new design m', observed);
    const seen = JSON.stringify(observed);
    // What moveMessages' CATCH lets pass, and only while XACT_STATE() = 1.
    const tolerated = [MSSQL_HANDLE_NOT_FOUND, MSSQL_END_STATE_ERROR];
    expect(inside.ok, seen).toBe(true);
    expect(tolerated, `END CONVERSATION on a handle that never existed: ${seen}`).toContain(row!.UnknownError);
    expect(row!.UnknownXactState, `the transaction after that error: ${seen}`).toBe(1);
    expect([0, ...tolerated], `END CONVERSATION again on a handle ended in this transaction: ${seen}`).toContain(
      row!.AgainError,
    );
    if (row!.AgainError !== 0) expect(row!.AgainXactState, `the transaction after that error: ${seen}`).toBe(1);
    expect(row, seen).toMatchObject({ XactState: 1, TranCount: 1 });
    expect(committed?.ok, `COMMIT after the tolerated errors: ${seen}`).toBe(true);
    expect(
      observed.endpoints.filter((e) => e.Initiator === 0 && !ENDED_FIRST.includes(e.State)),
      `our side is not ended: ${seen}`,
    ).toEqual([]);
    expect(observed.left, seen).toEqual([]);
  });
});
