import sql from 'mssql';
import { errorNumber } from '../../store/mssql/mssql.errors.js';
import {
  MSSQL_AUTOCOMMIT_SESSION,
  MSSQL_NESTED_OWN_TRANSACTION,
  MSSQL_OWN_TRANSACTION_GUARD,
} from '../../store/mssql/mssql.queries.js';
import { asCallerTransaction, nestedOwnTransaction, type MssqlQueueStore } from '../../store/mssql/mssql.store.js';
import type {
  BrokerConnection,
  BrokerDriver,
  BrokerParam,
  BrokerParams,
  BrokerParamType,
  BrokerRow,
  BrokerSession,
} from '../broker.types.js';

// The only broker file that loads `mssql`: the Nest layer imports it on demand, once a
// `broker` option is given, so an application without Service Broker never loads it.

export interface MssqlBrokerDriverOptions {
  /** Connections of the reader pool: the listeners' and the initiator readers' (receivers open their own). */
  readerConnections: number;
  /** requestTimeout of reader connections: above the WAITFOR timeout (checked with the options). */
  requestTimeoutMs: number;
  onBackgroundError?: (error: Error) => void;
}

/**
 * A BrokerDriver over the store's pool (autocommit statements, sends), a reader pool of its
 * own, and a connection of its own per receiver, both derived from the store pool's config.
 * Readers need their own pool: node-mssql's Transaction holds its connection from begin() to
 * commit, and a reader in WAITFOR holds it for the whole wait, so readers sharing the store's
 * pool would starve claims and enqueues.
 */
export async function createMssqlBrokerDriver(
  store: MssqlQueueStore,
  options: MssqlBrokerDriverOptions,
): Promise<MssqlBrokerDriver> {
  const shared = await store.connected();
  // mssql keeps the config a pool was built from on `config` (not in its typings).
  const base = (shared as unknown as { config: sql.config }).config;
  const readers = new sql.ConnectionPool(readerPoolConfig(base, options));
  readers.on('error', (error: Error) => options.onBackgroundError?.(error));
  await readers.connect();
  return new MssqlBrokerDriver(shared, readers, readerPoolConfig(base, { ...options, readerConnections: 1 }), options);
}

/**
 * The reader pool's config (and a receiver connection's, with one connection): the store's
 * server, login and TLS settings, with
 * - requestTimeout above the WAITFOR timeout: tedious cancels a request that has sent nothing
 *   back for requestTimeout ms, and an idle WAITFOR sends nothing until it times out;
 * - XACT_ABORT off (tedious's abortTransactionOnError): an error of our own in a receiving
 *   transaction must roll back to its savepoint, not doom it (a full rollback of a RECEIVE is
 *   what Service Broker's poison detection counts).
 */
export function readerPoolConfig(base: sql.config, options: MssqlBrokerDriverOptions): sql.config {
  return {
    ...base,
    requestTimeout: options.requestTimeoutMs,
    options: { ...base.options, requestTimeout: options.requestTimeoutMs, abortTransactionOnError: false },
    pool: { ...base.pool, min: 0, max: options.readerConnections },
  } as sql.config;
}

export class MssqlBrokerDriver implements BrokerDriver {
  constructor(
    private readonly shared: sql.ConnectionPool,
    private readonly readers: sql.ConnectionPool,
    /** A receiver's connection: the reader pool's settings, one connection. */
    private readonly connectionConfig: sql.config,
    private readonly options: Pick<MssqlBrokerDriverOptions, 'onBackgroundError'> = {},
  ) {}

  async beginReader(): Promise<BrokerSession> {
    const transaction = new sql.Transaction(this.readers);
    await transaction.begin(sql.ISOLATION_LEVEL.READ_COMMITTED);
    return new MssqlBrokerSession(transaction, true);
  }

  async begin(callerTransaction?: unknown): Promise<BrokerSession> {
    if (callerTransaction !== undefined) return new MssqlBrokerSession(asCallerTransaction(callerTransaction), false);
    const transaction = new sql.Transaction(this.shared);
    await transaction.begin(sql.ISOLATION_LEVEL.READ_COMMITTED);
    return new MssqlBrokerSession(transaction, true);
  }

  /** Behind the store's autocommit guard: the shared pool is the application's with `{ pool }` (review 2, R2-6). */
  async query<R extends BrokerRow = BrokerRow>(text: string, params?: BrokerParams): Promise<R[]> {
    return lastRecordset<R>(await bind(this.shared.request(), params).query(`${MSSQL_AUTOCOMMIT_SESSION}${text}`));
  }

  /** A pool of one connection: mssql pins a connection to nothing else than a transaction. */
  async openConnection(): Promise<BrokerConnection> {
    const pool = new sql.ConnectionPool(this.connectionConfig);
    pool.on('error', (error: Error) => this.options.onBackgroundError?.(error));
    await pool.connect();
    return new MssqlBrokerConnection(pool);
  }

  errorNumber(error: unknown): number | undefined {
    return errorNumber(error);
  }

  isCancelled(error: unknown): boolean {
    return (error as { code?: unknown } | null)?.code === 'ECANCEL';
  }

  /** Closes the reader pool; the store's pool is the store's to close. */
  async close(): Promise<void> {
    await this.readers.close();
  }
}

/** Requests one at a time, and an attention (cancel) for the one in flight. */
abstract class OneRequestAtATime {
  private current: sql.Request | null = null;

  protected abstract newRequest(): sql.Request;

  async query<R extends BrokerRow = BrokerRow>(text: string, params?: BrokerParams): Promise<R[]> {
    const request = bind(this.newRequest(), params);
    this.current = request;
    try {
      return lastRecordset<R>(await request.query(text));
    } finally {
      this.current = null;
    }
  }

  cancel(): void {
    this.current?.cancel();
  }
}

class MssqlBrokerConnection extends OneRequestAtATime implements BrokerConnection {
  constructor(private readonly pool: sql.ConnectionPool) {
    super();
  }

  protected newRequest(): sql.Request {
    return this.pool.request();
  }

  async close(): Promise<void> {
    await this.pool.close();
  }
}

/**
 * A transaction: the application's (its commit and rollback are the application's), or one
 * begun here, whose first statement carries MSSQL_OWN_TRANSACTION_GUARD (a transaction nested in
 * one the pooled connection already had would commit nothing).
 */
export class MssqlBrokerSession extends OneRequestAtATime implements BrokerSession {
  private guarded: boolean;

  constructor(
    private readonly transaction: sql.Transaction,
    private readonly owned: boolean,
    /** Requests bound to the transaction (a seam for the unit test of the guard). */
    private readonly requests: () => sql.Request = () => new sql.Request(transaction),
  ) {
    super();
    this.guarded = !owned;
  }

  override async query<R extends BrokerRow = BrokerRow>(text: string, params?: BrokerParams): Promise<R[]> {
    if (this.guarded) return super.query<R>(text, params);
    this.guarded = true;
    try {
      return await super.query<R>(`${MSSQL_OWN_TRANSACTION_GUARD}${text}`, params);
    } catch (error) {
      if (errorNumber(error) === MSSQL_NESTED_OWN_TRANSACTION)
        throw nestedOwnTransaction('Service Broker statement', error);
      throw error;
    }
  }

  protected newRequest(): sql.Request {
    return this.requests();
  }

  async commit(): Promise<void> {
    if (this.owned) await this.transaction.commit();
  }

  async rollback(): Promise<void> {
    if (this.owned) await this.transaction.rollback();
  }
}

/** "Resolves to the last result set's rows": a batch may SELECT after its WAITFOR. */
function lastRecordset<R>(result: sql.IResult<unknown>): R[] {
  const sets = result.recordsets as unknown as unknown[][] | undefined;
  return ((sets && sets.length > 0 ? sets[sets.length - 1] : result.recordset) ?? []) as R[];
}

/**
 * Short strings and buffers go as nvarchar(4000) / varbinary(8000), so a comparison with a key
 * column stays a seek and the plan is reused; longer ones as (max).
 */
function sqlType(param: BrokerParam): sql.ISqlType {
  const length = (param.value as { length?: unknown } | null)?.length;
  const short = (limit: number) => typeof length !== 'number' || length <= limit;
  const types: Record<BrokerParamType, () => sql.ISqlType> = {
    int: () => sql.Int(),
    bigint: () => sql.BigInt(),
    bit: () => sql.Bit(),
    nvarchar: () => sql.NVarChar(short(4000) ? 4000 : sql.MAX),
    uniqueidentifier: () => sql.UniqueIdentifier(),
    varbinary: () => sql.VarBinary(short(8000) ? 8000 : sql.MAX),
    datetime2: () => sql.DateTime2(3),
  };
  return types[param.type]();
}

function bind(request: sql.Request, params: BrokerParams | undefined): sql.Request {
  for (const [name, param] of Object.entries(params ?? {}) as [string, BrokerParam][]) {
    request.input(name, sqlType(param), param.value);
  }
  return request;
}
