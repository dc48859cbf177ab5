import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { dropPgSchema, PG_URL, sql, uniqueSchema } from '../helpers/databases.js';
import { parsePrometheusText, sampleValue } from '../helpers/prometheus-text.js';
import { startSampleApp, type RunningSampleApp } from '../helpers/sample-app.js';
import { TcpProxy } from '../helpers/tcp-proxy.js';
import { waitFor } from '../helpers/wait-for.js';

/**
 * The sample app over real HTTP, on the local PostgreSQL, reached through a TCP proxy the test
 * can cut. Its queue and its own tables live in schemas of this file's own.
 */
const queueSchema = uniqueSchema('e2eq');
const appSchema = uniqueSchema('e2eapp');
let proxy: TcpProxy;
let sample: RunningSampleApp;

/** A statement on the test database, seen from outside the application. */
function query<R extends Record<string, unknown>>(text: string, params: unknown[] = []): Promise<R[]> {
  return sql<R>(PG_URL, text, params);
}

async function json<T>(response: Response, status: number): Promise<T> {
  const body = await response.text();
  expect(response.status, body).toBe(status);
  return JSON.parse(body) as T;
}

async function sentKeys(): Promise<string[]> {
  const rows = await json<{ idempotencyKey: string }[]>(await sample.request('/emails/sent?limit=500'), 200);
  return rows.map((r) => r.idempotencyKey);
}

async function scrape() {
  const response = await sample.request('/metrics');
  expect(response.status).toBe(200);
  expect(response.headers.get('content-type')).toMatch(/^text\/plain; version=0\.0\.4/);
  return parsePrometheusText(await response.text());
}

beforeAll(async () => {
  proxy = await TcpProxy.forUrl(PG_URL, 5432);
  sample = await startSampleApp({
    SQLQUEUE_URL: proxy.urlFor(PG_URL),
    SQLQUEUE_SCHEMA: queueSchema,
    SAMPLE_APP_SCHEMA: appSchema,
    SQLQUEUE_POOL_SIZE: '6',
    HEALTH_DB_TIMEOUT_MS: '500',
    METRICS_CACHE_MS: '0',
    METRICS_TIMEOUT_MS: '1000',
    SHUTDOWN_TIMEOUT_MS: '2000',
  });
});

afterAll(async () => {
  await sample?.close();
  await proxy?.close();
  await dropPgSchema(queueSchema);
  await dropPgSchema(appSchema);
});

describe('sample app over HTTP (PostgreSQL)', () => {
  it('processes an email posted over HTTP, and the stats and metrics reflect it', async () => {
    const posted = await json<{ jobId: string; created: boolean }>(
      await sample.request('/emails', { body: { to: 'ada@example.com', subject: 'Hello' } }),
      202,
    );
    expect(posted.created).toBe(true);
    await waitFor(sentKeys, (keys) => keys.includes(`job:${posted.jobId}`), { what: 'the email to be sent' });
    // The handler's effect commits first; its completion follows in the next acknowledgement batch.
    await waitFor(
      () => query<{ state: string }>(`SELECT state FROM "${queueSchema}".jobs WHERE id = $1`, [posted.jobId]),
      (rows) => rows[0]?.state === 'done',
      { what: 'the job to be completed' },
    );

    // A delayed email waits: the stats show it as delayed, not ready.
    await json(
      await sample.request('/emails', { body: { to: 'bob@example.com', subject: 'Later', delayMs: 3_600_000 } }),
      202,
    );
    const stats = await waitFor(
      async () =>
        json<{
          stats: { ready: number; delayed: number; leased: number; dead: number };
          process: { completed: number; claimToDone: { count: number }; consumer: { readers: number } | null };
        }>(await sample.request('/queues/emails/stats'), 200),
      (s) => s.process.completed >= 1,
      { what: 'the completion in the process figures' },
    );
    expect(stats.stats).toMatchObject({ ready: 0, delayed: 1, leased: 0, dead: 0 });
    expect(stats.process.claimToDone.count).toBe(stats.process.completed);
    expect(stats.process.consumer?.readers).toBeGreaterThanOrEqual(1);

    const metrics = await waitFor(
      scrape,
      (m) => sampleValue(m, 'sqlqueue_jobs', { queue: 'emails', state: 'delayed' }) === 1,
      { what: 'the delayed email in the metrics' },
    );
    expect(sampleValue(metrics, 'sqlqueue_jobs_completed_total', { queue: 'emails' })).toBeGreaterThanOrEqual(1);
    expect(sampleValue(metrics, 'sqlqueue_job_duration_seconds_count', { queue: 'emails' })).toBeGreaterThanOrEqual(1);

    // A bad queue name is the client's error, with the library's message.
    const bad = await sample.request('/queues/not%20a%20queue/stats');
    expect(bad.status).toBe(400);
    expect(await bad.text()).toMatch(/queue name .* is invalid/);
  });

  it('refuses every dashboard request when DASHBOARD_PASSWORD is unset, and said so at boot', async () => {
    const page = await sample.request('/queues/', {
      headers: { authorization: `Basic ${Buffer.from('ops:anything').toString('base64')}` },
    });
    expect(page.status).toBe(403);
    expect(await page.text()).toMatch(/set DASHBOARD_PASSWORD/);
    expect((await sample.request('/queues/api/overview')).status).toBe(403);
    expect(sample.logger.matching(/queue dashboard at \/queues\/ is disabled: set DASHBOARD_PASSWORD/)).toHaveLength(1);
  });

  it('creates one job and one effect for the same idempotency key posted twice', async () => {
    const key = `order-${Date.now()}`;
    const email = { to: 'cy@example.com', subject: 'Your order' };
    const first = await json<{ jobId: string; created: boolean }>(
      await sample.request('/emails', { body: email, headers: { 'Idempotency-Key': key } }),
      202,
    );
    const second = await json<{ jobId: string; created: boolean }>(
      await sample.request('/emails', { body: email, headers: { 'Idempotency-Key': key } }),
      202,
    );
    expect(first.created).toBe(true);
    expect(second).toEqual({ jobId: first.jobId, created: false });
    await waitFor(sentKeys, (keys) => keys.includes(key), { what: 'the keyed email to be sent' });
    // After the job is done, the key still returns the same job (the body field works too).
    const third = await json<{ jobId: string; created: boolean }>(
      await sample.request('/emails', { body: { ...email, idempotencyKey: key } }),
      202,
    );
    expect(third).toEqual({ jobId: first.jobId, created: false });
    const jobs = await query<{ n: number }>(
      `SELECT count(*)::int AS n FROM "${queueSchema}".jobs WHERE queue = 'emails' AND idempotency_key = $1`,
      [key],
    );
    const effects = await query<{ n: number }>(
      `SELECT count(*)::int AS n FROM "${appSchema}".sent_emails WHERE idempotency_key = $1`,
      [key],
    );
    expect([jobs[0]!.n, effects[0]!.n]).toEqual([1, 1]);
  });

  it('commits a signup and its welcome email together, and rolls both back on a duplicate', async () => {
    const email = `dee-${Date.now()}@example.com`;
    const created = await json<{ signupId: string; jobId: string }>(
      await sample.request('/signups', { body: { email, name: 'Dee' } }),
      201,
    );
    await waitFor(sentKeys, (keys) => keys.includes(`welcome:${created.signupId}`), { what: 'the welcome email' });
    const countJobs = async () =>
      (await query<{ n: number }>(`SELECT count(*)::int AS n FROM "${queueSchema}".jobs WHERE queue = 'emails'`))[0]!.n;
    const before = await countJobs();
    const duplicate = await sample.request('/signups', { body: { email, name: 'Dee again' } });
    expect(duplicate.status).toBe(409);
    expect(await countJobs()).toBe(before);
  });

  it('reports not ready while the database is unreachable, and stays live', async () => {
    expect((await sample.request('/health/ready')).status).toBe(200);
    expect((await sample.request('/health/live')).status).toBe(200);
    // A partition: connections stay open and silent, so only the checks' own bounds end the wait.
    proxy.cut('blackhole');
    try {
      const startedAt = Date.now();
      const ready = await sample.request('/health/ready');
      const elapsed = Date.now() - startedAt;
      expect(ready.status).toBe(503);
      const body = (await ready.json()) as { error: { queue_database: { status: string; error: string } } };
      expect(body.error.queue_database).toMatchObject({ status: 'down', error: expect.stringMatching(/timed out/) });
      expect(elapsed).toBeLessThan(5_000);

      const live = await sample.request('/health/live');
      expect(live.status).toBe(200);
      expect(((await live.json()) as { status: string }).status).toBe('ok');

      // The scrape still answers, in bounded time, saying it could not read the database.
      const scrapeStartedAt = Date.now();
      const metrics = await scrape();
      expect(Date.now() - scrapeStartedAt).toBeLessThan(5_000);
      expect(sampleValue(metrics, 'sqlqueue_stats_up')).toBe(0);
      expect(sampleValue(metrics, 'sqlqueue_jobs', { queue: 'emails', state: 'ready' })).toBeUndefined();

      // A refused database (connections reset) is reported the same way.
      proxy.cut('reset');
      expect((await sample.request('/health/ready')).status).toBe(503);
      expect((await sample.request('/health/live')).status).toBe(200);
    } finally {
      proxy.restore();
    }
    await waitFor(
      async () => (await sample.request('/health/ready')).status,
      (status) => status === 200,
      { what: 'readiness to come back', timeoutMs: 20_000 },
    );
    // And the queue works again: claims recover on their own.
    const after = await json<{ jobId: string }>(
      await sample.request('/emails', { body: { to: 'eve@example.com', subject: 'Back' } }),
      202,
    );
    await waitFor(sentKeys, (keys) => keys.includes(`job:${after.jobId}`), {
      what: 'an email after the outage',
      timeoutMs: 20_000,
    });
  });

  it('serves /metrics as valid Prometheus text with the queue families', async () => {
    // Four emails were sent so far; the last completion may still be on its way (acks are batched).
    const metrics = await waitFor(
      scrape,
      (m) =>
        sampleValue(m, 'sqlqueue_stats_up') === 1 &&
        (sampleValue(m, 'sqlqueue_jobs_completed_total', { queue: 'emails' }) ?? 0) >= 4,
      { what: 'database figures and four completions in the metrics' },
    );
    const types = Object.fromEntries([...metrics.values()].map((f) => [f.name, f.type]));
    expect(types).toMatchObject({
      sqlqueue_stats_up: 'gauge',
      sqlqueue_jobs: 'gauge',
      sqlqueue_oldest_ready_age_seconds: 'gauge',
      sqlqueue_expired_leases: 'gauge',
      sqlqueue_repeatedly_failing_jobs: 'gauge',
      sqlqueue_recent_failures: 'gauge',
      sqlqueue_job_duration_seconds: 'histogram',
      sqlqueue_job_latency_seconds: 'histogram',
      sqlqueue_jobs_completed_total: 'counter',
      sqlqueue_jobs_failed_total: 'counter',
      sqlqueue_lost_ownership_total: 'counter',
      sqlqueue_reader_activations_total: 'counter',
      sqlqueue_readers: 'gauge',
    });
    for (const family of metrics.values()) expect(family.help, family.name).toBeTruthy();
    expect(sampleValue(metrics, 'sqlqueue_stats_up')).toBe(1);
    expect(sampleValue(metrics, 'sqlqueue_readers', { queue: 'emails' })).toBeGreaterThanOrEqual(1);
    const completed = sampleValue(metrics, 'sqlqueue_jobs_completed_total', { queue: 'emails' })!;
    expect(sampleValue(metrics, 'sqlqueue_job_latency_seconds_count', { queue: 'emails' })).toBe(completed);
    expect(sampleValue(metrics, 'sqlqueue_job_duration_seconds_bucket', { queue: 'emails', le: '+Inf' })).toBe(
      completed,
    );
  });
});
