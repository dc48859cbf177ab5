// The driver objects an application hands to the queue, described by what the queue uses of
// them. Public types name these shapes, never the drivers' own types: the drivers are optional
// peers, and a pg-only application has no `mssql` (nor PGlite) types to resolve. A real
// `pg.Pool`, `mssql.ConnectionPool`, `mssql.config` and `PGlite` instance fits each shape as is.

/** The part of a node-postgres `pg.Pool` the queue relies on; pass the `pg.Pool` itself. */
export interface SqlQueuePgPool {
  readonly totalCount: number;
  readonly idleCount: number;
  connect(): Promise<unknown>;
  query(text: string, values?: unknown[]): Promise<unknown>;
}

/** A PGlite instance or one of its transactions, as far as running a statement goes. */
export interface SqlQueuePGliteQueryable {
  query(text: string, params?: unknown[]): Promise<{ rows: unknown[] }>;
}

/** The part of a `PGlite` instance (from `@electric-sql/pglite`) the queue relies on. */
export interface SqlQueuePGlite extends SqlQueuePGliteQueryable {
  transaction<T>(callback: (tx: SqlQueuePGliteQueryable) => Promise<T>): Promise<T>;
  listen(channel: string, callback: (payload: string) => void): Promise<() => Promise<void>>;
  close(): Promise<void>;
}

/** The part of an `mssql.ConnectionPool` the queue relies on; pass the `ConnectionPool` itself. */
export interface SqlQueueMssqlPool {
  readonly connected: boolean;
  connect(): Promise<unknown>;
  request(): unknown;
  close(): Promise<unknown>;
}

/*
 * mssql's nested option objects are interfaces with dozens of tedious fields. An index signature
 * of `any` is the only one an interface-typed value (mssql's own `config`) is assignable to, and
 * it lets an object literal carry any option without this library listing them all.
 */
/* eslint-disable @typescript-eslint/no-explicit-any */

/**
 * An `mssql` connection config (`mssql.config`), handed to `new mssql.ConnectionPool(config)`
 * unchanged. The common fields are typed here; a value typed as mssql's own `config` is accepted
 * as is, which is the way to pass a top-level field not listed here.
 */
export interface SqlQueueMssqlConfig {
  server: string;
  port?: number;
  user?: string;
  password?: string;
  database?: string;
  domain?: string;
  driver?: string;
  connectionTimeout?: number;
  requestTimeout?: number;
  options?: {
    encrypt?: boolean | string;
    trustServerCertificate?: boolean;
    instanceName?: string;
    appName?: string;
    trustedConnection?: boolean;
    /** Any other tedious connection option. */
    [option: string]: any;
  };
  pool?: {
    max?: number;
    min?: number;
    idleTimeoutMillis?: number;
    acquireTimeoutMillis?: number;
    /** Any other pool option. */
    [option: string]: any;
  };
  /** tedious authentication, e.g. `{ type: 'ntlm', options: { userName, password, domain } }`. */
  authentication?: {
    type: string;
    options?: { [option: string]: any };
  };
}
/* eslint-enable @typescript-eslint/no-explicit-any */
