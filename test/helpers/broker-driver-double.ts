import type {
  BrokerConnection,
  BrokerDriver,
  BrokerParams,
  BrokerRow,
  BrokerSession,
} from '../../lib/src/broker/broker.types.js';

/**
 * A recorded `BrokerDriver` for unit tests of the broker runtime (no SQL Server runs here).
 *
 * - Every call is recorded in order in `calls`: which session (a reader transaction, a shared-pool
 *   transaction, the caller's transaction, a receiver's own connection, or an autocommit batch),
 *   the statement text and params, and commit / rollback / cancel / close.
 * - Statements are answered from a script. `on(match, respond)` answers every matching statement;
 *   `once(match, respond)` answers the next one only (FIFO, before `on`). `match` is the exact SQL
 *   text (what a query function returns: `double.on(readerQueries.receiveOne(queue, 'json'), …)`),
 *   a RegExp, or a predicate. An unmatched statement answers `[]`, or throws with `strict: true`.
 * - `respond` returns rows (or a promise of rows), or throws: `brokerError(1205, 'deadlock')` makes
 *   an error whose number `errorNumber()` reads. `{ dooms: true }` also dooms the transaction:
 *   its later statements and its commit fail with 3930, only rollback() ends it.
 * - `hold(match)` blocks the next matching statement until the test releases it; `cancel()` on its
 *   session rejects it with an error for which `isCancelled()` is true (as tedious' attention
 *   does), and the transaction stays open (as on the server).
 * - Transaction discipline is enforced, not only recorded: a statement or commit on an ended
 *   session, a second request while one is in flight (tedious' one-request rule), and
 *   `ROLLBACK TRANSACTION x` without a matching `SAVE TRANSACTION x` throw, and each lands in
 *   `violations` (so a caller that swallows the error still fails `assertDiscipline()`).
 */
export class BrokerDriverDouble implements BrokerDriver {
  readonly calls: BrokerCall[] = [];
  readonly violations: string[] = [];
  readonly sessions: BrokerSessionDouble[] = [];
  readonly connections: BrokerConnectionDouble[] = [];
  private readonly persistent: Responder[] = [];
  private readonly onceQueue: Responder[] = [];
  private readonly holds: { match: StatementMatch; hold: HeldStatement }[] = [];
  private readonly strict: boolean;
  closed = false;

  constructor(options: { strict?: boolean } = {}) {
    this.strict = options.strict ?? false;
  }

  /** Answers every statement that matches (later `on` registrations win over earlier ones). */
  on(match: StatementMatch, respond: Respond): this {
    this.persistent.unshift({ match, respond });
    return this;
  }

  /** Answers the next matching statement only; queued answers for one statement go in order. */
  once(match: StatementMatch, respond: Respond): this {
    this.onceQueue.push({ match, respond });
    return this;
  }

  /**
   * Blocks the next matching statement until `release(rows)` or `fail(error)`; `reached` resolves
   * when it arrives. A session's cancel() rejects it with a cancellation error.
   */
  hold(match: StatementMatch): HeldStatement {
    const hold = new HeldStatement();
    this.holds.push({ match, hold });
    return hold;
  }

  // ---- BrokerDriver

  async beginReader(): Promise<BrokerSession> {
    return this.openSession('reader');
  }

  async begin(callerTransaction?: unknown): Promise<BrokerSession> {
    return this.openSession(callerTransaction === undefined ? 'shared' : 'caller');
  }

  async openConnection(): Promise<BrokerConnection> {
    if (this.closed) this.violate('openConnection after close()');
    const connection = new BrokerConnectionDouble(this, this.sessions.length + this.connections.length + 1);
    this.connections.push(connection);
    this.calls.push({ kind: 'begin', session: 'connection', sessionId: connection.id });
    return connection;
  }

  async query<R extends BrokerRow = BrokerRow>(text: string, params: BrokerParams = {}): Promise<R[]> {
    if (this.closed) this.violate('query after close()');
    const call: BrokerCall = { kind: 'query', session: 'autocommit', sessionId: 0, text, params };
    this.calls.push(call);
    return (await this.answer(call, undefined)) as R[];
  }

  errorNumber(error: unknown): number | undefined {
    const n = (error as { number?: unknown } | null)?.number;
    return typeof n === 'number' ? n : undefined;
  }

  isCancelled(error: unknown): boolean {
    return error instanceof BrokerCancelledError;
  }

  async close(): Promise<void> {
    this.calls.push({ kind: 'close' });
    this.closed = true;
  }

  // ---- Reading the record

  /** The statements in order, optionally of one session kind: `double.statements('reader')`. */
  statements(session?: BrokerSessionKind): string[] {
    return this.calls
      .filter((c): c is BrokerQueryCall => c.kind === 'query' && (session === undefined || c.session === session))
      .map((c) => c.text);
  }

  /**
   * The record as short lines, for exact sequence assertions: `reader#1 SAVE TRANSACTION sq;`,
   * `reader#1 commit`, `autocommit <text>`. Pass `name` to replace known texts with labels.
   */
  log(name: (text: string) => string = (text) => text): string[] {
    return this.calls.map((c) => {
      if (c.session === undefined) return 'close';
      const who = c.session === 'autocommit' ? 'autocommit' : `${c.session}#${c.sessionId}`;
      if (c.kind === 'query') return `${who} ${name(c.text)}`;
      return `${who} ${c.kind}`;
    });
  }

  /** The params of the `index`th call (default the last) of a matching statement. */
  paramsOf(match: StatementMatch, index = -1): BrokerParams {
    const found = this.calls.filter((c): c is BrokerQueryCall => c.kind === 'query' && matches(match, c.text));
    const call = found.at(index);
    if (!call) throw new Error(`BrokerDriverDouble: no call matched ${describe(match)}`);
    return call.params;
  }

  /** Throws listing every discipline violation, and any session left open when `allEnded`. */
  assertDiscipline(options: { allEnded?: boolean } = {}): void {
    const problems = [...this.violations];
    if (options.allEnded) {
      for (const s of this.sessions) if (s.state === 'open') problems.push(`${s.label} was never ended`);
      for (const c of this.connections) if (!c.closed) problems.push(`${c.label} was never closed`);
    }
    if (problems.length) throw new Error(`BrokerDriverDouble: ${problems.join('; ')}`);
  }

  // ---- internals

  private openSession(kind: 'reader' | 'shared' | 'caller'): BrokerSessionDouble {
    if (this.closed) this.violate('begin after close()');
    const session = new BrokerSessionDouble(this, kind, this.sessions.length + 1);
    this.sessions.push(session);
    this.calls.push({ kind: 'begin', session: kind, sessionId: session.id });
    return session;
  }

  /** @internal */
  violate(problem: string): never {
    this.violations.push(problem);
    throw new Error(`BrokerDriverDouble: ${problem}`);
  }

  /** @internal */
  async answer(call: BrokerQueryCall, session: BrokerSessionDouble | undefined): Promise<BrokerRow[]> {
    const held = this.holds.findIndex((h) => matches(h.match, call.text));
    if (held >= 0) {
      const [{ hold }] = this.holds.splice(held, 1);
      return hold.arrive(call, session);
    }
    const onceIndex = this.onceQueue.findIndex((r) => matches(r.match, call.text));
    const responder =
      onceIndex >= 0
        ? this.onceQueue.splice(onceIndex, 1)[0]
        : this.persistent.find((r) => matches(r.match, call.text));
    if (!responder) {
      if (this.strict) this.violate(`no responder for: ${call.text}`);
      return [];
    }
    try {
      return (await responder.respond(call.params, call)) ?? [];
    } catch (error) {
      if ((error as { dooms?: boolean }).dooms && session) session.doomed = true;
      throw error;
    }
  }
}

export type BrokerSessionKind = 'reader' | 'shared' | 'caller' | 'connection' | 'autocommit';

export interface BrokerQueryCall {
  kind: 'query';
  session: BrokerSessionKind;
  /** 1-based in order of begin; 0 for autocommit batches. */
  sessionId: number;
  text: string;
  params: BrokerParams;
}

export type BrokerCall =
  | BrokerQueryCall
  | {
      kind: 'begin' | 'commit' | 'rollback' | 'cancel' | 'close';
      session: Exclude<BrokerSessionKind, 'autocommit'>;
      sessionId: number;
    }
  | { kind: 'close'; session?: undefined };

/** Exact SQL text, a RegExp, or a predicate over the text. */
export type StatementMatch = string | RegExp | ((text: string) => boolean);

export type Respond = (params: BrokerParams, call: BrokerQueryCall) => BrokerRow[] | void | Promise<BrokerRow[] | void>;

interface Responder {
  match: StatementMatch;
  respond: Respond;
}

/** A session of the double: one transaction on one connection. */
export class BrokerSessionDouble implements BrokerSession {
  state: 'open' | 'committed' | 'rolledBack' = 'open';
  doomed = false;
  /** Savepoint names set by SAVE TRANSACTION in this transaction. */
  readonly savepoints: string[] = [];
  private inFlight: { reject(error: unknown): void } | null = null;

  constructor(
    private readonly driver: BrokerDriverDouble,
    readonly kind: 'reader' | 'shared' | 'caller',
    readonly id: number,
  ) {}

  get label(): string {
    return `${this.kind}#${this.id}`;
  }

  async query<R extends BrokerRow = BrokerRow>(text: string, params: BrokerParams = {}): Promise<R[]> {
    const call: BrokerQueryCall = { kind: 'query', session: this.kind, sessionId: this.id, text, params };
    this.driver.calls.push(call);
    if (this.state !== 'open') this.driver.violate(`${this.label}: statement after ${this.state}: ${text}`);
    if (this.inFlight) this.driver.violate(`${this.label}: a second request while one is in flight: ${text}`);
    if (this.doomed)
      throw brokerError(
        3930,
        'The current transaction cannot be committed and cannot support operations that write to the log file. Roll back the transaction.',
      );
    const save = /^\s*SAVE\s+TRAN(?:SACTION)?\s+(\w+)\s*;/i.exec(text);
    const partial = /^\s*ROLLBACK\s+TRAN(?:SACTION)?\s+(\w+)\s*;/i.exec(text);
    if (partial && !this.savepoints.includes(partial[1]))
      this.driver.violate(`${this.label}: ROLLBACK TRANSACTION ${partial[1]} without SAVE TRANSACTION ${partial[1]}`);
    let cancelled!: (error: unknown) => void;
    const cancel = new Promise<never>((_, reject) => (cancelled = reject));
    cancel.catch(() => undefined);
    this.inFlight = { reject: cancelled };
    try {
      const rows = await Promise.race([this.driver.answer(call, this), cancel]);
      if (save) this.savepoints.push(save[1]);
      return rows as R[];
    } finally {
      this.inFlight = null;
    }
  }

  cancel(): void {
    this.driver.calls.push({ kind: 'cancel', session: this.kind, sessionId: this.id });
    // An attention with nothing in flight does nothing (tedious ignores it too).
    this.inFlight?.reject(new BrokerCancelledError());
  }

  async commit(): Promise<void> {
    this.driver.calls.push({ kind: 'commit', session: this.kind, sessionId: this.id });
    if (this.state !== 'open') this.driver.violate(`${this.label}: commit after ${this.state}`);
    if (this.inFlight) this.driver.violate(`${this.label}: commit while a request is in flight`);
    if (this.doomed) throw brokerError(3930, 'The current transaction cannot be committed. Roll back the transaction.');
    this.state = 'committed';
  }

  async rollback(): Promise<void> {
    this.driver.calls.push({ kind: 'rollback', session: this.kind, sessionId: this.id });
    if (this.state !== 'open') this.driver.violate(`${this.label}: rollback after ${this.state}`);
    if (this.inFlight) this.driver.violate(`${this.label}: rollback while a request is in flight`);
    this.state = 'rolledBack';
  }
}

/**
 * A receiver's own connection: batches in autocommit (a batch may open and end a transaction
 * itself, which the double does not model), one request at a time, cancel, close.
 */
export class BrokerConnectionDouble implements BrokerConnection {
  closed = false;
  private inFlight: { reject(error: unknown): void } | null = null;

  constructor(
    private readonly driver: BrokerDriverDouble,
    readonly id: number,
  ) {}

  get label(): string {
    return `connection#${this.id}`;
  }

  async query<R extends BrokerRow = BrokerRow>(text: string, params: BrokerParams = {}): Promise<R[]> {
    const call: BrokerQueryCall = { kind: 'query', session: 'connection', sessionId: this.id, text, params };
    this.driver.calls.push(call);
    if (this.closed) this.driver.violate(`${this.label}: statement after close: ${text}`);
    if (this.inFlight) this.driver.violate(`${this.label}: a second request while one is in flight: ${text}`);
    let cancelled!: (error: unknown) => void;
    const cancel = new Promise<never>((_, reject) => (cancelled = reject));
    cancel.catch(() => undefined);
    this.inFlight = { reject: cancelled };
    try {
      return (await Promise.race([this.driver.answer(call, undefined), cancel])) as R[];
    } finally {
      this.inFlight = null;
    }
  }

  cancel(): void {
    this.driver.calls.push({ kind: 'cancel', session: 'connection', sessionId: this.id });
    this.inFlight?.reject(new BrokerCancelledError());
  }

  async close(): Promise<void> {
    this.driver.calls.push({ kind: 'close', session: 'connection', sessionId: this.id });
    if (this.inFlight) this.driver.violate(`${this.label}: close while a request is in flight`);
    this.closed = true;
  }
}

/** A statement the test holds: see `BrokerDriverDouble.hold`. */
export class HeldStatement {
  /** Resolves with the call when the statement arrives. */
  readonly reached: Promise<BrokerQueryCall>;
  private arrived!: (call: BrokerQueryCall) => void;
  private settle: { resolve(rows: BrokerRow[]): void; reject(error: unknown): void } | null = null;
  private early: { rows?: BrokerRow[]; error?: unknown } | null = null;

  constructor() {
    this.reached = new Promise((resolve) => (this.arrived = resolve));
  }

  /** Lets the statement answer `rows` (also before it arrives). */
  release(rows: BrokerRow[] = []): void {
    if (this.settle) this.settle.resolve(rows);
    else this.early = { rows };
  }

  /** Makes the statement fail with `error`. */
  fail(error: unknown): void {
    if (this.settle) this.settle.reject(error);
    else this.early = { error };
  }

  /** @internal */
  arrive(call: BrokerQueryCall, _session: BrokerSessionDouble | undefined): Promise<BrokerRow[]> {
    this.arrived(call);
    if (this.early) {
      const { rows, error } = this.early;
      return error !== undefined ? Promise.reject(error) : Promise.resolve(rows ?? []);
    }
    return new Promise((resolve, reject) => (this.settle = { resolve, reject }));
  }
}

/** The rejection of a request stopped by cancel() (tedious: ECANCEL). */
export class BrokerCancelledError extends Error {
  readonly code = 'ECANCEL';
  constructor() {
    super('Canceled.');
    this.name = 'BrokerCancelledError';
  }
}

/**
 * An error as the mssql driver reports a server error: `number` is the SQL Server error number.
 * `dooms` makes the double treat the session's transaction as uncommittable afterwards.
 */
export function brokerError(number: number, message = `error ${number}`, options: { dooms?: boolean } = {}): Error {
  return Object.assign(new Error(message), { number, dooms: options.dooms ?? false });
}

function matches(match: StatementMatch, text: string): boolean {
  if (typeof match === 'string') return match === text;
  if (match instanceof RegExp) return match.test(text);
  return match(text);
}

function describe(match: StatementMatch): string {
  return typeof match === 'string' ? JSON.stringify(match.slice(0, 80)) : String(match);
}
