import { resolve } from 'node:path';

/** Everything the sample app reads from its environment, resolved and checked once at boot. */
export interface SampleConfig {
  /** HTTP port (PORT, default 3000; 0 picks a free one). */
  port: number;
  /**
   * SQLQUEUE_URL: a `postgres://` URL, or an `mssql://` / `sqlserver://` URL or ADO connection
   * string for SQL Server. Unset: an embedded PostgreSQL (PGlite) in `dataDir`.
   */
  databaseUrl: string | null;
  dialect: 'postgres' | 'mssql';
  /** Schema of the queue's tables (SQLQUEUE_SCHEMA, default 'sqlqueue'). */
  queueSchema: string;
  /** Schema of the app's own tables, signups and sent emails (SAMPLE_APP_SCHEMA, default 'sample_app'). */
  appSchema: string;
  /** PGlite data folder (SAMPLE_DATA_DIR, default sample-app/.data/pglite; 'memory://' for none). */
  dataDir: string;
  /** Connections in the pool shared by the app and the queue (SQLQUEUE_POOL_SIZE, default 10). */
  poolSize: number;
  /** Bound of the readiness round trip (HEALTH_DB_TIMEOUT_MS, default 2000). */
  readinessTimeoutMs: number;
  /** How long shutdown waits for running handlers (SHUTDOWN_TIMEOUT_MS, default 10000). */
  shutdownTimeoutMs: number;
  /** Reuse of the all-queue database reading behind /metrics (METRICS_CACHE_MS, default 5000). */
  metricsCacheMs: number;
  /** Bound of that reading; a slower one is reported as failed (METRICS_TIMEOUT_MS, default 3000). */
  metricsTimeoutMs: number;
  /**
   * Password of the queue dashboard at /queues (DASHBOARD_PASSWORD; HTTP Basic, any user name).
   * Unset: the dashboard refuses every request.
   */
  dashboardPassword: string | null;
}

const IDENTIFIER = /^[A-Za-z_][A-Za-z0-9_]{0,62}$/;

function integer(env: NodeJS.ProcessEnv, name: string, fallback: number, min: number, max: number): number {
  const raw = env[name];
  if (raw === undefined || raw === '') return fallback;
  const value = Number(raw);
  if (!Number.isInteger(value) || value < min || value > max) {
    throw new Error(`${name} must be an integer from ${min} to ${max}, got '${raw}'`);
  }
  return value;
}

function identifier(env: NodeJS.ProcessEnv, name: string, fallback: string): string {
  const value = env[name] || fallback;
  if (!IDENTIFIER.test(value)) {
    throw new Error(`${name} must be a schema name (a letter or _, then letters, digits or _), got '${value}'`);
  }
  return value;
}

/** Which dialect a SQLQUEUE_URL names; SQL Server accepts the URL form or an ADO string. */
export function dialectOf(url: string): 'postgres' | 'mssql' {
  if (/^postgres(ql)?:\/\//i.test(url)) return 'postgres';
  if (/^(mssql|sqlserver):\/\//i.test(url) || /(^|;)\s*(server|data source)\s*=/i.test(url)) return 'mssql';
  throw new Error(
    "SQLQUEUE_URL must be 'postgres://user:password@host:5432/db', 'mssql://user:password@host:1433/db' or an ADO connection string ('Server=…;Database=…')",
  );
}

/** Reads the configuration from environment variables (see README, "Run the sample app"). */
export function loadConfig(env: NodeJS.ProcessEnv = process.env): SampleConfig {
  const databaseUrl = env.SQLQUEUE_URL?.trim() || null;
  return {
    port: integer(env, 'PORT', 3000, 0, 65_535),
    databaseUrl,
    dialect: databaseUrl ? dialectOf(databaseUrl) : 'postgres',
    queueSchema: identifier(env, 'SQLQUEUE_SCHEMA', 'sqlqueue'),
    appSchema: identifier(env, 'SAMPLE_APP_SCHEMA', 'sample_app'),
    dataDir:
      env.SAMPLE_DATA_DIR === 'memory://'
        ? 'memory://'
        : resolve(env.SAMPLE_DATA_DIR || resolve(process.cwd(), 'sample-app/.data/pglite')),
    poolSize: integer(env, 'SQLQUEUE_POOL_SIZE', 10, 2, 200),
    readinessTimeoutMs: integer(env, 'HEALTH_DB_TIMEOUT_MS', 2_000, 50, 60_000),
    shutdownTimeoutMs: integer(env, 'SHUTDOWN_TIMEOUT_MS', 10_000, 0, 600_000),
    metricsCacheMs: integer(env, 'METRICS_CACHE_MS', 5_000, 0, 600_000),
    metricsTimeoutMs: integer(env, 'METRICS_TIMEOUT_MS', 3_000, 10, 120_000),
    dashboardPassword: env.DASHBOARD_PASSWORD || null,
  };
}

/** DI token of the SampleConfig. */
export const SAMPLE_CONFIG = Symbol('SAMPLE_CONFIG');
