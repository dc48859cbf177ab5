import { type CanActivate, type ExecutionContext, Inject, Injectable, Module } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { FastifyAdapter } from '@nestjs/platform-fastify';
import { ScheduleModule } from '@nestjs/schedule';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { QueueStore } from '../../lib/src/core/queue-store.js';
import { SqlQueueDashboardModule, type SqlQueueDashboardOptions } from '../../lib/src/dashboard.js';
import {
  QueueHandler,
  QueueProducer,
  SQL_QUEUE_RUNTIME,
  SqlQueueModule,
  type SqlQueueRuntime,
} from '../../lib/src/index.js';
import { CaptureLogger } from '../helpers/capture-logger.js';
import { dropPgSchema, PG_URL, uniqueSchema } from '../helpers/databases.js';
import { waitFor } from '../helpers/wait-for.js';

/**
 * The dashboard's HTTP side over real HTTP, on Express and on Fastify: access, the page and its
 * headers, every API route against a store state made here, and the CSRF and read-only rules
 * of the actions. One schema for the file; each adapter's queues carry its name.
 */
const schema = uniqueSchema('dash');
afterAll(() => dropPgSchema(schema));

/** Lets through requests that say `x-test-user: ok`. */
@Injectable()
class TestUserGuard implements CanActivate {
  canActivate(context: ExecutionContext): boolean {
    return context.switchToHttp().getRequest<{ headers: Record<string, string> }>().headers['x-test-user'] === 'ok';
  }
}

/** A guard with a dependency of its own, from a module that is not global (SqlQueueDashboardModule's `imports`). */
@Injectable()
class OpsTokens {
  readonly expected = 'ops-token-1';
}

@Module({ providers: [OpsTokens], exports: [OpsTokens] })
class OpsAuthModule {}

@Injectable()
class OpsTokenGuard implements CanActivate {
  constructor(@Inject(OpsTokens) private readonly tokens: OpsTokens) {}

  canActivate(context: ExecutionContext): boolean {
    const headers = context.switchToHttp().getRequest<{ headers: Record<string, string> }>().headers;
    return headers['x-ops-token'] === this.tokens.expected;
  }
}

const XSS = '<script>alert(1)</script><img src=x onerror=alert(2)>';

interface Reply {
  status: number;
  body: unknown;
  text: string;
  headers: Headers;
}

interface RunningDashboard {
  /** http://127.0.0.1:<port> */
  url: string;
  store: QueueStore;
  producer: QueueProducer;
  logger: CaptureLogger;
  request(path: string, init?: { method?: string; body?: unknown; headers?: Record<string, string> }): Promise<Reply>;
  /** The page's CSRF token, and the cookie carrying it. */
  session(path?: string): Promise<{ token: string; cookie: string }>;
  close(): Promise<void>;
}

async function startDashboard(
  adapter: 'express' | 'fastify',
  dashboard: SqlQueueDashboardOptions,
  options: { prefix?: string; queues?: string[]; handlers?: unknown[]; user?: boolean } = {},
): Promise<RunningDashboard> {
  @Module({
    imports: [
      ScheduleModule.forRoot(),
      SqlQueueModule.forRoot({
        connection: { dialect: 'postgres', url: PG_URL, poolSize: 4 },
        schema,
        queues: Object.fromEntries((options.queues ?? []).map((queue) => [queue, {}])),
        metrics: { cacheMs: 0 },
        throughput: { flushIntervalMs: 100 },
        consumer: { minPollMs: 10, maxPollMs: 100 },
      }),
      SqlQueueDashboardModule.forRoot(dashboard),
    ],
    providers: (options.handlers ?? []) as never[],
  })
  class AppModule {}
  const logger = new CaptureLogger();
  const nestOptions = { logger, abortOnError: false };
  const app =
    adapter === 'fastify'
      ? await NestFactory.create(AppModule, new FastifyAdapter(), nestOptions)
      : await NestFactory.create(AppModule, nestOptions);
  if (options.prefix) app.setGlobalPrefix(options.prefix);
  await app.listen(0, '127.0.0.1');
  const url = `http://127.0.0.1:${(app.getHttpServer() as { address(): { port: number } }).address().port}`;
  const request: RunningDashboard['request'] = async (path, init = {}) => {
    const response = await fetch(`${url}${path}`, {
      method: init.method ?? (init.body === undefined ? 'GET' : 'POST'),
      headers: {
        ...(options.user === false ? {} : { 'x-test-user': 'ok' }),
        ...(init.body === undefined ? {} : { 'content-type': 'application/json' }),
        ...init.headers,
      },
      body: init.body === undefined ? undefined : JSON.stringify(init.body),
      signal: AbortSignal.timeout(20_000),
    });
    const text = await response.text();
    const json = response.headers.get('content-type')?.includes('application/json') ? JSON.parse(text) : undefined;
    return { status: response.status, body: json, text, headers: response.headers };
  };
  const runtime = app.get<SqlQueueRuntime>(SQL_QUEUE_RUNTIME);
  return {
    url,
    store: runtime.store,
    producer: app.get(QueueProducer),
    logger,
    request,
    async session(path = '/queues') {
      const page = await request(path);
      const token = /<meta name="sqlqueue-csrf" content="([^"]+)"/.exec(page.text)![1]!;
      return { token, cookie: `sqlqueue_csrf=${token}` };
    },
    close: () => app.close(),
  };
}

/** A handler per adapter: its queue name carries the adapter's. */
function workHandler(queue: string) {
  @QueueHandler(queue, { maxAttempts: 1 })
  class WorkHandler {
    async handle(payload: { fail?: boolean }): Promise<void> {
      if (payload.fail) throw new Error(`refused ${XSS}`);
    }
  }
  return WorkHandler;
}

/** Enqueues a job (ahead of every other of its queue) and lets it die on its first attempt. */
async function deadJob(dash: RunningDashboard, queue: string, options: { groupKey?: string } = {}): Promise<string> {
  const { jobId } = await dash.producer.enqueue(queue, { html: XSS }, { maxAttempts: 1, priority: 1000, ...options });
  const [claimed] = await dash.store.claim({ queue, limit: 1, leaseMs: 60_000, workerId: 'test-worker' });
  expect(claimed?.id).toBe(jobId);
  await dash.store.fail([
    {
      id: jobId,
      claimToken: claimed!.claimToken,
      error: `failed: ${XSS}`,
      stack: `Error: ${XSS}\n    at test`,
      retryDelayMs: 0,
      dead: true,
      workerId: 'test-worker',
    },
  ]);
  return jobId;
}

describe.each(['express', 'fastify'] as const)('dashboard over HTTP on %s', (adapter) => {
  const q = (name: string) => `${adapter}-${name}`;
  let dash: RunningDashboard;

  beforeAll(async () => {
    dash = await startDashboard(
      adapter,
      { guard: TestUserGuard },
      { queues: [q('idle')], handlers: [workHandler(q('work'))] },
    );
    // Before any request: the overview's list of recently active queues is cached for 15 s.
    await dash.store.recordThroughput([{ queue: q('past'), completed: 3, failed: 1, dead: 0 }]);
  });
  afterAll(() => dash?.close());

  it('refuses every page, asset and API request the guard refuses, actions included', async () => {
    const anonymous = { headers: { 'x-test-user': 'no' } };
    for (const path of ['/queues', '/queues/', '/queues/assets/dashboard.js', '/queues/api/overview']) {
      const reply = await dash.request(path, anonymous);
      expect(reply.status, path).toBe(403);
      expect(reply.headers.get('cache-control'), path).toBe('no-store');
    }
    const { token, cookie } = await dash.session();
    const action = await dash.request(`/queues/api/queues/${q('dead')}/dead/purge`, {
      body: { all: true },
      headers: { ...anonymous.headers, cookie, 'x-sqlqueue-csrf': token },
    });
    expect(action.status).toBe(403);
  });

  it('runs a guard whose dependencies come from the modules in `imports`', async () => {
    const guarded = await startDashboard(adapter, { guard: OpsTokenGuard, imports: [OpsAuthModule] }, { user: false });
    try {
      expect((await guarded.request('/queues/api/overview')).status).toBe(403);
      const allowed = await guarded.request('/queues/api/overview', { headers: { 'x-ops-token': 'ops-token-1' } });
      expect(allowed.status).toBe(200);
    } finally {
      await guarded.close();
    }
  });

  it('serves the page at /queues and /queues/ with its placeholders filled, a CSRF cookie and strict headers', async () => {
    for (const path of ['/queues', '/queues/']) {
      const page = await dash.request(path);
      expect(page.status, path).toBe(200);
      expect(page.headers.get('content-type')).toMatch(/^text\/html/);
      expect(page.text).toContain('<base href="/queues/" />');
      expect(page.text).toContain('<meta name="sqlqueue-read-only" content="false" />');
      expect(page.text).toContain('<meta name="sqlqueue-refresh-ms" content="2000" />');
      expect(page.text).not.toMatch(/%[A-Z_]+%/);
      const token = /<meta name="sqlqueue-csrf" content="([A-Za-z0-9_-]{43})"/.exec(page.text)?.[1];
      expect(page.headers.getSetCookie()).toEqual([`sqlqueue_csrf=${token}; Path=/queues/; HttpOnly; SameSite=Strict`]);
      expect(page.headers.get('content-security-policy')).toBe(
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'self'; form-action 'self'; frame-ancestors 'none'",
      );
      expect(page.headers.get('x-content-type-options')).toBe('nosniff');
      expect(page.headers.get('referrer-policy')).toBe('same-origin');
      expect(page.headers.get('cache-control')).toBe('no-store');
    }
    // A tab reloading with the cookie keeps its token, so other open tabs keep working.
    const { token, cookie } = await dash.session();
    const again = await dash.request('/queues', { headers: { cookie } });
    expect(again.text).toContain(`content="${token}"`);
  });

  it('serves only the allow-listed assets, with their content types', async () => {
    const js = await dash.request('/queues/assets/dashboard.js');
    expect(js.status).toBe(200);
    expect(js.headers.get('content-type')).toMatch(/^text\/javascript/);
    expect(js.headers.get('cache-control')).toBe('no-cache');
    expect(js.headers.get('x-content-type-options')).toBe('nosniff');
    expect(js.text.length).toBeGreaterThan(100);
    const css = await dash.request('/queues/assets/dashboard.css');
    expect(css.headers.get('content-type')).toMatch(/^text\/css/);
    for (const path of ['/queues/assets/index.html', '/queues/assets/..%2Fdashboard.service.ts', '/queues/nothing']) {
      expect((await dash.request(path)).status, path).toBe(404);
    }
  });

  it('overview: counts of the store state, known and recently active queues as zeros, sorted', async () => {
    const queue = q('over');
    await dash.producer.enqueue(queue, { n: 1 });
    await dash.producer.enqueue(queue, { n: 2 });
    await dash.producer.enqueue(queue, { n: 3 }, { delayMs: 3_600_000 });
    await deadJob(dash, queue);
    await dash.producer.enqueue(queue, { n: 4 }, { priority: 5 });
    await dash.store.claim({ queue, limit: 1, leaseMs: 60_000, workerId: 'test-worker' });

    const overview = await dash.request('/queues/api/overview');
    expect(overview.status).toBe(200);
    expect(overview.headers.get('cache-control')).toBe('no-store');
    const body = overview.body as { queues: { queue: string }[] } & Record<string, unknown>;
    expect(body).toMatchObject({ readOnly: false, refreshMs: 2000, failureWindowMs: 900_000, databaseError: null });
    expect(new Date(body.now as string).toISOString()).toBe(body.now);
    expect(body.queues.find((x) => x.queue === queue)).toEqual({
      queue,
      ready: 2,
      delayed: 1,
      leased: 1,
      expiredLeases: 0,
      dead: 1,
      retrying: 0,
      blockedGroups: 0,
      oldestReadyAgeMs: expect.any(Number),
      paused: false,
      recentFailures: 1,
      recentLeaseExpiries: 0,
      repeatedlyFailing: 0,
    });
    for (const name of [q('idle'), q('past'), q('work')]) {
      expect(
        body.queues.find((x) => x.queue === name),
        name,
      ).toMatchObject({ ready: 0, dead: 0 });
    }
    const names = body.queues.map((x) => x.queue);
    expect(names).toEqual([...names].sort());
  });

  it('throughput: the outcomes a real consumer recorded, per minute, with a window from 1 to 1440 minutes', async () => {
    const queue = q('work');
    await dash.producer.enqueue(queue, {});
    await dash.producer.enqueue(queue, {});
    await dash.producer.enqueue(queue, { fail: true });
    const sum = (buckets: { queue: string; completed: number; failed: number; dead: number }[]) =>
      buckets
        .filter((b) => b.queue === queue)
        .reduce((s, b) => ({ completed: s.completed + b.completed, dead: s.dead + b.dead }), { completed: 0, dead: 0 });
    await waitFor(
      async () => sum((await dash.store.readThroughput(5)).buckets),
      (s) => s.completed === 2 && s.dead === 1,
      { what: 'the consumer to record its outcomes' },
    );
    // A window not read yet by this app, so not cached.
    const reply = await dash.request('/queues/api/throughput?minutes=5');
    expect(reply.status).toBe(200);
    const body = reply.body as { now: string; minutes: number; buckets: { queue: string; minute: string }[] };
    expect(body.minutes).toBe(5);
    expect(sum(body.buckets as never)).toEqual({ completed: 2, dead: 1 });
    expect(body.buckets.find((b) => b.queue === queue)?.minute).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:00\.000Z$/);
    expect((await dash.request('/queues/api/throughput')).body).toMatchObject({ minutes: 60 });
    for (const minutes of ['0', '1441', 'x', '1.5']) {
      const bad = await dash.request(`/queues/api/throughput?minutes=${minutes}`);
      expect(bad.status, minutes).toBe(400);
      expect((bad.body as { message: string }).message).toMatch(/^minutes must be an integer from 1 to 1440/);
    }
  });

  it('lists a queue’s jobs per state, paging with the cursor', async () => {
    const queue = q('list');
    const ready = [];
    for (let n = 0; n < 3; n++) ready.push((await dash.producer.enqueue(queue, { n, html: XSS })).jobId);
    const dead = await deadJob(dash, queue);
    const delayed = (await dash.producer.enqueue(queue, {}, { delayMs: 3_600_000 })).jobId;
    const { jobId: leased } = await dash.producer.enqueue(queue, {}, { priority: 10 });
    await dash.store.claim({ queue, limit: 1, leaseMs: 60_000, workerId: 'test-worker' });
    const { jobId: done } = await dash.producer.enqueue(queue, {}, { priority: 10 });
    const [claimed] = await dash.store.claim({ queue, limit: 1, leaseMs: 60_000, workerId: 'test-worker' });
    await dash.store.complete([{ id: done, claimToken: claimed!.claimToken }]);

    type Page = { jobs: Record<string, unknown>[]; nextCursor: string | null; scanLimited: boolean };
    const list = async (query: string) => {
      const reply = await dash.request(`/queues/api/queues/${queue}/jobs?${query}`);
      expect(reply.status, query).toBe(200);
      return reply.body as Page;
    };
    const first = await list('state=ready&limit=2');
    expect(first.jobs.map((j) => j.id)).toEqual(ready.slice(0, 2));
    expect(first.jobs[0]).toMatchObject({ state: 'ready', payloadPreview: expect.stringContaining(XSS) });
    expect(first.jobs[0]!.createdAt).toMatch(/Z$/);
    expect(first.nextCursor).toEqual(expect.any(String));
    const second = await list(`state=ready&limit=2&cursor=${first.nextCursor}`);
    expect(second).toEqual({ jobs: [expect.objectContaining({ id: ready[2] })], nextCursor: null, scanLimited: false });
    expect((await list('state=delayed')).jobs.map((j) => j.id)).toEqual([delayed]);
    expect((await list('state=leased')).jobs.map((j) => j.id)).toEqual([leased]);
    const deadPage = await list('state=dead');
    expect(deadPage.jobs).toEqual([expect.objectContaining({ id: dead, lastErrorPreview: `failed: ${XSS}` })]);
    expect(await list('state=done')).toMatchObject({ jobs: [{ id: done, state: 'done' }], scanLimited: false });
    expect((await list('')).jobs).toHaveLength(3);

    const refusals: [string, RegExp][] = [
      [`${queue}/jobs?state=finished`, /^job state 'finished' is invalid: use ready, delayed, leased, done, dead/],
      [`${queue}/jobs?limit=0`, /^limit must be an integer from 1 to 500, got 0/],
      [`${queue}/jobs?limit=501`, /^limit must be an integer from 1 to 500/],
      [`${queue}/jobs?limit=ten`, /^limit must be an integer from 1 to 500, got 'ten'/],
      [`${queue}/jobs?state=ready&cursor=${first.nextCursor}x`, /cursor .* is malformed/],
      [`${queue}/jobs?state=dead&cursor=${first.nextCursor}`, /cursor .* is malformed/],
      [`${queue}/jobs?state=ready&state=dead`, /^job state an array is invalid/],
      [`bad%20name/jobs`, /^queue name 'bad name' is invalid/],
    ];
    for (const [path, message] of refusals) {
      const reply = await dash.request(`/queues/api/queues/${path}`);
      expect(reply.status, path).toBe(400);
      expect((reply.body as { message: string }).message, path).toMatch(message);
      expect(reply.headers.get('cache-control')).toBe('no-store');
    }
  });

  it('shows a job with its attempts, never its claim token; 404 and 400 for a missing or malformed id', async () => {
    const queue = q('detail');
    const id = await deadJob(dash, queue, { groupKey: XSS });
    const reply = await dash.request(`/queues/api/jobs/${id}`);
    expect(reply.status).toBe(200);
    const { job, attempts } = reply.body as { job: Record<string, unknown>; attempts: Record<string, unknown>[] };
    expect(job).toMatchObject({
      id,
      queue,
      state: 'dead',
      payload: { html: XSS },
      groupKey: XSS,
      lastError: `failed: ${XSS}`,
    });
    expect(job).not.toHaveProperty('claimToken');
    expect(attempts).toEqual([
      expect.objectContaining({
        attempt: 1,
        outcome: 'failed',
        stack: `Error: ${XSS}\n    at test`,
        workerId: 'test-worker',
      }),
    ]);
    expect(attempts[0]!.finishedAt).toMatch(/Z$/);

    const missing = await dash.request('/queues/api/jobs/999999999999');
    expect(missing.status).toBe(404);
    expect((missing.body as { message: string }).message).toMatch(/^no job 999999999999/);
    for (const bad of ['abc', '0', '12345678901234567890', '-1']) {
      const replyBad = await dash.request(`/queues/api/jobs/${bad}`);
      expect(replyBad.status, bad).toBe(400);
      expect((replyBad.body as { message: string }).message).toMatch(/^job id .* is invalid/);
    }
  });

  it('retries and purges dead jobs only with the page’s CSRF token from this origin', async () => {
    const queue = q('dead');
    const [a, b, c, d] = [
      await deadJob(dash, queue),
      await deadJob(dash, queue),
      await deadJob(dash, queue),
      await deadJob(dash, queue),
    ];
    const { token, cookie } = await dash.session();
    const post = (action: string, body: unknown, headers: Record<string, string>) =>
      dash.request(`/queues/api/queues/${queue}/dead/${action}`, { body, headers });

    const forged: Record<string, string>[] = [
      { cookie },
      { cookie, 'x-sqlqueue-csrf': token.replace(/^./, (ch) => (ch === 'A' ? 'B' : 'A')) },
      { 'x-sqlqueue-csrf': token },
      { cookie, 'x-sqlqueue-csrf': token, origin: 'http://evil.test' },
    ];
    for (const headers of forged) {
      const reply = await post('retry', { all: true }, headers);
      expect(reply.status, JSON.stringify(headers)).toBe(403);
      expect((reply.body as { message: string }).message).toMatch(/^missing or invalid CSRF token/);
    }
    expect((await dash.store.getJob(a))!.state).toBe('dead');

    const ok = { cookie, 'x-sqlqueue-csrf': token };
    const retried = await post('retry', { ids: [a] }, { ...ok, origin: dash.url });
    expect(retried).toMatchObject({ status: 200, body: { retried: [a] } });
    expect((await dash.store.getJob(a))!.state).toBe('ready');
    const purged = await post('purge', { ids: [b, a] }, ok);
    expect(purged).toMatchObject({ status: 200, body: { purged: 1 } });
    expect(await dash.store.getJob(b)).toBeNull();
    expect((await dash.store.getJob(a))!.state).toBe('ready');
    expect(await post('retry', { all: true }, ok)).toMatchObject({ status: 200, body: { retried: [c, d] } });
    // Purge all, in a queue of its own: the jobs retried above are ahead of any new dead job here.
    const other = q('dead-all');
    await deadJob(dash, other);
    await deadJob(dash, other);
    const purgedAll = await dash.request(`/queues/api/queues/${other}/dead/purge`, {
      body: { all: true },
      headers: ok,
    });
    expect(purgedAll).toMatchObject({ status: 200, body: { purged: 2 } });
    expect((await dash.store.stats(other)).dead).toBe(0);

    const refusals: [unknown, RegExp][] = [
      [{}, /^the body must be \{ "ids"/],
      [{ ids: [] }, /got ids of 0/],
      [{ ids: ['x'] }, /^job id 'x' is invalid/],
      [{ ids: Array.from({ length: 1001 }, (_, i) => String(i + 1)) }, /got ids of 1001/],
      [{ all: 'yes' }, /^the body must be/],
      [{ all: true, ids: [a] }, /^the body must be/],
      [{ every: true }, /^request body: unknown option 'every'/],
      [[a], /^request body must be an object, got an array/],
    ];
    for (const [body, message] of refusals) {
      const reply = await post('purge', body, ok);
      expect(reply.status, JSON.stringify(body)).toBe(400);
      expect((reply.body as { message: string }).message).toMatch(message);
    }
  });

  it('lists, pauses, resumes and triggers schedules; 404 for an unknown one', async () => {
    const id = q('nightly');
    await dash.producer.schedule(id, { cron: '0 3 * * *', queue: q('idle'), payload: { html: XSS } });
    const { token, cookie } = await dash.session();
    const act = (action: string, schedule = id) =>
      dash.request(`/queues/api/schedules/${schedule}/${action}`, {
        method: 'POST',
        headers: { cookie, 'x-sqlqueue-csrf': token },
      });
    const listed = async () =>
      ((await dash.request('/queues/api/schedules')).body as { schedules: Record<string, unknown>[] }).schedules.find(
        (s) => s.id === id,
      );
    expect(await listed()).toMatchObject({
      id,
      queue: q('idle'),
      cron: '0 3 * * *',
      paused: false,
      payload: { html: XSS },
    });
    expect(await act('pause')).toMatchObject({ status: 200, body: { ok: true } });
    expect(await listed()).toMatchObject({ paused: true });
    expect(await act('resume')).toMatchObject({ status: 200, body: { ok: true } });
    expect(await listed()).toMatchObject({ paused: false });
    const triggered = await act('trigger');
    expect(triggered).toMatchObject({ status: 200, body: { jobId: expect.any(String), created: true } });
    const { jobId, tick } = triggered.body as { jobId: string; tick: string };
    expect(await dash.store.getJob(jobId)).toMatchObject({ queue: q('idle'), payload: { html: XSS } });
    expect(new Date(tick).toISOString()).toBe(tick);
    const unknown = await act('pause', 'no-such-schedule');
    expect(unknown.status).toBe(404);
    expect((unknown.body as { message: string }).message).toMatch(/^no schedule 'no-such-schedule'/);
  });

  it('pauses and resumes a queue for every instance; the overview shows it at once; a bad reason is a 400', async () => {
    const queue = q('pausable');
    const { token, cookie } = await dash.session();
    const act = (action: string, body: unknown = {}) =>
      dash.request(`/queues/api/queues/${queue}/${action}`, { body, headers: { cookie, 'x-sqlqueue-csrf': token } });
    const overviewRow = async () =>
      (
        (await dash.request('/queues/api/overview')).body as { queues: { queue: string; paused: boolean }[] }
      ).queues.find((row) => row.queue === queue);
    expect(await act('pause', { reason: 'incident' })).toMatchObject({ status: 200, body: { paused: true } });
    expect(await act('pause')).toMatchObject({ status: 200, body: { paused: false } });
    expect(await dash.producer.listPausedQueues()).toContainEqual(
      expect.objectContaining({ queue, reason: 'incident' }),
    );
    expect(await overviewRow()).toMatchObject({ queue, paused: true });
    expect(await act('resume')).toMatchObject({ status: 200, body: { resumed: true } });
    // A queue with no job and no pause has nothing to show: it leaves the overview.
    expect((await overviewRow())?.paused ?? false).toBe(false);
    expect(await act('resume')).toMatchObject({ status: 200, body: { resumed: false } });
    for (const [body, message] of [
      [{ reason: 42 }, /reason must be a string of at most 1000 characters/],
      [{ why: 'x' }, /unknown option 'why'/],
    ] as const) {
      const reply = await act('pause', body);
      expect(reply.status, JSON.stringify(reply.body)).toBe(400);
      expect((reply.body as { message: string }).message).toMatch(message);
    }
    expect(await dash.producer.listPausedQueues()).not.toContainEqual(expect.objectContaining({ queue }));
  });

  it('cancels a ready job, reports a finished one, and 400s a malformed id', async () => {
    const queue = q('cancelable');
    const { jobId } = await dash.producer.enqueue(queue, { n: 1 }, { delayMs: 3_600_000 });
    const { token, cookie } = await dash.session();
    const cancel = (id: string) =>
      dash.request(`/queues/api/jobs/${id}/cancel`, { body: {}, headers: { cookie, 'x-sqlqueue-csrf': token } });
    expect(await cancel(jobId)).toMatchObject({
      status: 200,
      body: { id: jobId, outcome: 'canceled', state: 'canceled' },
    });
    expect(await dash.store.getJob(jobId)).toMatchObject({
      state: 'canceled',
      cancelReason: 'canceled from the dashboard',
    });
    expect(await cancel(jobId)).toMatchObject({ status: 200, body: { outcome: 'finished', state: 'canceled' } });
    expect((await cancel('12x')).status).toBe(400);
  });

  it('lists ordered groups a dead job blocks', async () => {
    const queue = q('groups');
    await dash.store.recordQueueSettings([{ queue, maxAttempts: 1, groupOnDead: 'block' }]);
    const blocking = await deadJob(dash, queue, { groupKey: XSS });
    await dash.producer.enqueue(queue, {}, { groupKey: XSS });
    const reply = await dash.request(`/queues/api/queues/${queue}/groups?limit=10`);
    expect(reply.status).toBe(200);
    expect(reply.body).toEqual({
      groups: [{ groupKey: XSS, jobId: blocking, error: `failed: ${XSS}`, diedAt: expect.stringMatching(/Z$/) }],
      nextAfterKey: null,
    });
    const after = await dash.request(`/queues/api/queues/${queue}/groups?after=${encodeURIComponent(XSS)}`);
    expect(after.body).toEqual({ groups: [], nextAfterKey: null });
    expect((await dash.request(`/queues/api/queues/${queue}/groups?limit=0`)).status).toBe(400);
    // A position no group key can be is bad input, never a failed statement.
    const nul = await dash.request(`/queues/api/queues/${queue}/groups?after=a%00`);
    expect(nul.status).toBe(400);
    expect((nul.body as { message: string }).message).toMatch(/^blocked groups: after contains U\+0000/);
  });

  it('flow usage: the recorded limits, what runs, the keys at their limit and the busiest keys', async () => {
    const queue = q('flow');
    const limits = {
      globalConcurrency: 10,
      concurrencyPerKey: 1,
      rateLimit: { max: 50, perMs: 1_000 },
      rateLimitPerKey: null,
    };
    await dash.store.recordQueueSettings([{ queue, maxAttempts: 3, limits }]);
    for (const key of [XSS, 'b', 'b', 'c']) await dash.producer.enqueue(queue, {}, { concurrencyKey: key });
    const claimed = await dash.store.claim({
      queue,
      limit: 10,
      leaseMs: 60_000,
      workerId: 'test-worker',
      limited: true,
    });
    expect(claimed).toHaveLength(3);
    const reply = await dash.request(`/queues/api/queues/${queue}/flow?limit=2`);
    expect(reply.status).toBe(200);
    expect(reply.body).toEqual({
      queue,
      limits,
      running: 3,
      windowStarts: 3,
      keysAtLimit: 1,
      keys: [
        { key: 'b', running: 1, waiting: 1 },
        { key: XSS, running: 1, waiting: 0 },
      ],
    });
    const unlimited = await dash.request(`/queues/api/queues/${q('work')}/flow`);
    expect(unlimited.body).toMatchObject({ limits: null, windowStarts: null, keysAtLimit: null, keys: [] });
    expect((await dash.request(`/queues/api/queues/${queue}/flow?limit=500`)).status).toBe(400);
  });
});

describe.each(['express', 'fastify'] as const)(
  'read-only dashboard without a guard, under a global prefix, on %s',
  (adapter) => {
    let dash: RunningDashboard;

    beforeAll(async () => {
      dash = await startDashboard(
        adapter,
        { guard: 'none', readOnly: true, refreshMs: 5000 },
        { prefix: 'admin', user: false, queues: [`${adapter}-idle-ro`] },
      );
    });
    afterAll(() => dash?.close());

    it('serves the page at /admin/queues and /admin/queues/, not at /queues', async () => {
      for (const path of ['/admin/queues', '/admin/queues/']) {
        const page = await dash.request(path);
        expect(page.status, path).toBe(200);
        expect(page.text).toContain('<base href="/admin/queues/" />');
        expect(page.text).toContain('<meta name="sqlqueue-read-only" content="true" />');
        expect(page.text).toContain('<meta name="sqlqueue-refresh-ms" content="5000" />');
        expect(page.headers.getSetCookie()[0]).toMatch(/; Path=\/admin\/queues\/; HttpOnly; SameSite=Strict$/);
      }
      expect((await dash.request('/queues')).status).toBe(404);
      expect((await dash.request('/admin/queues/api/overview')).body).toMatchObject({
        readOnly: true,
        refreshMs: 5000,
      });
    });

    it('refuses every action, even with a valid CSRF token, and changes nothing', async () => {
      const queue = `${adapter}-readonly`;
      const id = await deadJob(dash, queue);
      await dash.producer.schedule(`${adapter}-ro`, { cron: '0 3 * * *', queue: `${adapter}-idle-ro` });
      const { token, cookie } = await dash.session('/admin/queues');
      const headers = { cookie, 'x-sqlqueue-csrf': token };
      for (const [path, body] of [
        [`/admin/queues/api/queues/${queue}/dead/retry`, { all: true }],
        [`/admin/queues/api/queues/${queue}/dead/purge`, { ids: [id] }],
        [`/admin/queues/api/schedules/${adapter}-ro/trigger`, {}],
        [`/admin/queues/api/queues/${queue}/pause`, {}],
        [`/admin/queues/api/queues/${queue}/resume`, {}],
        [`/admin/queues/api/jobs/${id}/cancel`, {}],
      ] as const) {
        const reply = await dash.request(path, { body, headers });
        expect(reply.status, path).toBe(403);
        expect(reply.body, path).toMatchObject({ message: 'the dashboard is read-only' });
      }
      expect((await dash.store.getJob(id))!.state).toBe('dead');
      expect((await dash.store.listJobs({ queue: `${adapter}-idle-ro`, state: 'ready', limit: 10 })).jobs).toEqual([]);
      expect((await dash.store.stats(queue)).paused).toBe(false);
    });
  },
);
