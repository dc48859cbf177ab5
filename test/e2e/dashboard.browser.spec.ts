import { mkdir, writeFile } from 'node:fs/promises';
import {
  Injectable,
  Module,
  type CanActivate,
  type ExecutionContext,
  type INestApplication,
  type Type,
} from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ScheduleModule } from '@nestjs/schedule';
import type { Browser, BrowserContext, Page } from 'playwright-core';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { SqlQueueDashboardModule } from '../../lib/src/dashboard.js';
import {
  QueueHandler,
  QueueProducer,
  SqlQueueModule,
  type JobContext,
  type JobState,
  type QueueJobHandler,
  type QueueStore,
  SQL_QUEUE_RUNTIME,
  type SqlQueueRuntime,
} from '../../lib/src/index.js';
import { CaptureLogger } from '../helpers/capture-logger.js';
import {
  browserTestsEnabled,
  countOf,
  inPage,
  launchChromium,
  testIdText,
  waitForTestIdText,
} from '../helpers/chromium.js';
import { dropPgSchema, PG_URL, sql, uniqueSchema } from '../helpers/databases.js';
import { deferred, waitFor } from '../helpers/wait-for.js';
import { createEffectTables, killAllWorkers, WorkerProcess } from '../helpers/worker-process.js';

/**
 * The dashboard page in a real Chromium, against a real Nest app (HTTP, PostgreSQL, handlers):
 * live refresh, job detail, dead-job actions, the guard, read-only mode, hostile data, and the
 * screenshots the README shows (SQLQUEUE_UPDATE_SCREENSHOTS=1 writes them to docs/).
 */

const schema = uniqueSchema('dash');
const AUTH_HEADER = 'x-test-dashboard-auth';
const AUTH_TOKEN = 'open-sesame';
const VIEWPORT = { width: 1280, height: 800 };
const UPDATE_DOCS = process.env.SQLQUEUE_UPDATE_SCREENSHOTS === '1';

/** What the handlers do, from the payload: wait for a gate, fail until a tag is healed. */
interface WorkPayload {
  gate?: string;
  failUntil?: string;
  /** The error of each attempt, in turn. */
  errors?: string[];
  [field: string]: unknown;
}

const healed = new Set<string>();
const gates = new Map<string, Promise<void>>();
/** Errors by idempotency key, for a job whose payload must look like a real one (the screenshot's). */
const scriptedErrors = new Map<string, string[]>();

async function work(payload: WorkPayload, context: JobContext): Promise<void> {
  if (payload.gate) await gates.get(payload.gate);
  const scripted = context.idempotencyKey === null ? undefined : scriptedErrors.get(context.idempotencyKey);
  if (scripted) throw new Error(scripted[(context.attempt - 1) % scripted.length]);
  if (payload.failUntil !== undefined && !healed.has(payload.failUntil)) {
    const errors = payload.errors ?? [`refused until '${payload.failUntil}' is healed`];
    throw new Error(errors[(context.attempt - 1) % errors.length]);
  }
}

const QUICK_RETRIES = { maxAttempts: 3, backoff: { type: 'fixed', delayMs: 0 }, maxReaders: 4 } as const;

@QueueHandler('emails', QUICK_RETRIES)
@Injectable()
class EmailsHandler implements QueueJobHandler<WorkPayload> {
  handle(payload: WorkPayload, context: JobContext): Promise<void> {
    return work(payload, context);
  }
}

@QueueHandler('webhooks', QUICK_RETRIES)
@Injectable()
class WebhooksHandler implements QueueJobHandler<WorkPayload> {
  handle(payload: WorkPayload, context: JobContext): Promise<void> {
    return work(payload, context);
  }
}

@QueueHandler('invoices', QUICK_RETRIES)
@Injectable()
class InvoicesHandler implements QueueJobHandler<WorkPayload> {
  handle(payload: WorkPayload, context: JobContext): Promise<void> {
    return work(payload, context);
  }
}

/** Lets in the requests that carry the test's header (the browser context adds it to all of them). */
@Injectable()
class HeaderGuard implements CanActivate {
  canActivate(context: ExecutionContext): boolean {
    return (
      context.switchToHttp().getRequest<{ headers: Record<string, unknown> }>().headers[AUTH_HEADER] === AUTH_TOKEN
    );
  }
}

interface RunningApp {
  app: INestApplication;
  /** Where the dashboard is: http://127.0.0.1:<port>/queues/ */
  dashboard: string;
  producer: QueueProducer;
  store: QueueStore;
}

/** A Nest HTTP app on this file's schema: handlers (unless `consume` is false) and the dashboard. */
async function bootApp(options: {
  consume: boolean;
  guard: Type<CanActivate> | 'none';
  readOnly?: boolean;
}): Promise<RunningApp> {
  @Module({
    imports: [
      ScheduleModule.forRoot(),
      SqlQueueModule.forRoot({
        connection: { dialect: 'postgres', url: PG_URL, poolSize: 4 },
        schema,
        // 'reports' has no handler here: its jobs wait, and its counts grow.
        queues: { reports: {} },
        consumer: { enabled: options.consume, maxPollMs: 200 },
        metrics: { cacheMs: 100 },
        throughput: { flushIntervalMs: 200 },
        schedules: {
          'nightly-report': {
            cron: '0 3 * * *',
            timezone: 'Europe/Paris',
            queue: 'reports',
            payload: { kind: 'daily' },
          },
        },
      }),
      SqlQueueDashboardModule.forRoot({
        path: '/queues',
        guard: options.guard,
        readOnly: options.readOnly ?? false,
        refreshMs: 500,
      }),
    ],
    providers: options.consume ? [EmailsHandler, WebhooksHandler, InvoicesHandler] : [],
  })
  class DashboardTestModule {}
  const app = await NestFactory.create(DashboardTestModule, { logger: new CaptureLogger(), abortOnError: false });
  await app.listen(0, '127.0.0.1');
  const { port } = (app.getHttpServer() as { address(): { port: number } }).address();
  return {
    app,
    dashboard: `http://127.0.0.1:${port}/queues/`,
    producer: app.get(QueueProducer),
    store: app.get<SqlQueueRuntime>(SQL_QUEUE_RUNTIME).store,
  };
}

let main: RunningApp;
let readOnly: RunningApp | undefined;
let browser: Browser;
let context: BrowserContext;
let page: Page;
/** Script errors and Content-Security-Policy violations seen by any page: none is expected. */
const pageProblems: string[] = [];
/** The jobs the screenshots show, enqueued at the start so they are done by then. */
let bulk: Promise<{ webhookJobId: string; completions: number }>;

function watch(target: Page): Page {
  target.on('pageerror', (error) => pageProblems.push(`page error: ${error.message}`));
  target.on('console', (message) => {
    if (/Content Security Policy|Refused to/i.test(message.text())) pageProblems.push(`console: ${message.text()}`);
  });
  // confirm() before purges and "all" actions: the tests accept them.
  target.on('dialog', (dialog) => void dialog.accept());
  return target;
}

/** Shows a dashboard route in the shared page, loading the page first if needed. */
async function show(hash: string, target: Page = page, base: string = main.dashboard): Promise<void> {
  if (target.url().startsWith(base)) await inPage(target, `location.hash = ${JSON.stringify(hash)}`);
  else await target.goto(`${base}${hash}`);
}

async function stateOf(id: string): Promise<JobState | null> {
  return (await main.producer.getJob(id))?.state ?? null;
}

function untilState(id: string, state: JobState): Promise<JobState | null> {
  return waitFor(
    () => stateOf(id),
    (s) => s === state,
    { what: `job ${id} to be ${state}` },
  );
}

function rowCount(target: Page, ids: readonly string[]): Promise<number> {
  return countOf(target, ids.map((id) => `[data-testid="job-row-${id}"]`).join(', '));
}

/** Realistic traffic for the chart and the screenshots: a few hundred jobs, some failing for good. */
async function runBulkLoad(producer: QueueProducer) {
  const emails = Array.from({ length: 160 }, (_, i) => ({
    payload: { to: `customer${i}@example.com`, template: 'receipt' },
  }));
  const invoices = Array.from({ length: 120 }, (_, i) => ({ payload: { invoice: `INV-${2000 + i}` } }));
  const webhooks = Array.from({ length: 90 }, (_, i) => ({
    payload: {
      event: 'order.paid',
      orderId: `ord_${1000 + i}`,
      ...(i % 30 === 7 ? { failUntil: 'never', errors: ['HTTP 410 Gone from https://hooks.example.net/legacy'] } : {}),
    },
  }));
  await Promise.all([
    producer.enqueueMany('emails', emails),
    producer.enqueueMany('invoices', invoices),
    producer.enqueueMany('webhooks', webhooks),
  ]);
  const idempotencyKey = 'order.refunded:ord_8F3K2';
  scriptedErrors.set(idempotencyKey, [
    'connect ECONNREFUSED 10.0.4.12:443',
    'HTTP 502 Bad Gateway from https://hooks.example.com/orders',
    'HTTP 503 Service Unavailable from https://hooks.example.com/orders (retry-after: 120)',
  ]);
  const { jobId } = await producer.enqueue(
    'webhooks',
    {
      event: 'order.refunded',
      orderId: 'ord_8F3K2',
      amount: { value: 4900, currency: 'EUR' },
      endpoint: 'https://hooks.example.com/orders',
      signature: 'sha256',
    },
    { idempotencyKey, groupKey: 'customer-1042', priority: 5 },
  );
  return { webhookJobId: jobId, completions: emails.length + invoices.length + webhooks.length - 3 };
}

beforeAll(async () => {
  if (!browserTestsEnabled) return;
  browser = await launchChromium();
  main = await bootApp({ consume: true, guard: HeaderGuard });
  bulk = runBulkLoad(main.producer);
  // Awaited, and its failure reported, by the tests that need it.
  bulk.catch(() => undefined);
  context = await browser.newContext({ viewport: VIEWPORT, extraHTTPHeaders: { [AUTH_HEADER]: AUTH_TOKEN } });
  page = watch(await context.newPage());
});

afterEach(() => {
  expect(pageProblems.splice(0)).toEqual([]);
});

afterAll(async () => {
  await killAllWorkers();
  await browser?.close();
  await readOnly?.app.close();
  await main?.app.close();
  await dropPgSchema(schema);
});

describe.skipIf(!browserTestsEnabled)('dashboard page in Chromium', () => {
  it('refreshes the overview counts live, without reloading, as jobs arrive and run', async () => {
    await show('#/');
    await waitForTestIdText(page, 'count-reports-ready', (t) => t === '0');
    await inPage(page, 'window.__sameDocument = true');

    await main.producer.enqueueMany(
      'reports',
      [1, 2, 3].map((n) => ({ payload: { report: n } })),
    );
    await waitForTestIdText(page, 'count-reports-ready', (t) => t === '3', 'the 3 waiting reports');

    const gate = deferred<void>();
    gates.set('live', gate.promise);
    await main.producer.enqueueMany('emails', [{ payload: { gate: 'live' } }, { payload: { gate: 'live' } }]);
    await waitForTestIdText(page, 'count-emails-leased', (t) => t === '2', 'both gated emails leased');
    gate.resolve();
    await waitForTestIdText(page, 'count-emails-leased', (t) => t === '0', 'both gated emails done');

    expect(await inPage(page, 'window.__sameDocument')).toBe(true);
    expect(await testIdText(page, 'last-updated')).toMatch(/Updated \d\d:\d\d:\d\d/);
    expect(await page.getByTestId('error-banner').isHidden()).toBe(true);
  });

  it('keeps its links in the page when opened at the mount path without the trailing slash', async () => {
    await page.goto(main.dashboard.replace(/\/$/, ''));
    await waitForTestIdText(page, 'count-reports-ready', () => true);
    expect(new URL(page.url()).pathname).toBe('/queues/');
    await inPage(page, 'window.__sameDocument = "no slash"');
    await page.locator('[data-testid="queue-row-emails"] a').first().click();
    await waitFor(
      () => countOf(page, '[data-testid="jobs-table"]'),
      (n) => n === 1,
      { what: "the queue's jobs" },
    );
    expect(new URL(page.url()).hash).toBe('#/queues/emails/ready');
    expect(await inPage(page, 'window.__sameDocument')).toBe('no slash');
  });

  it("shows a dead job's attempts with error and stack, and retries it to completion", async () => {
    const { jobId } = await main.producer.enqueue(
      'emails',
      { to: 'ada@example.com', failUntil: 'detail', errors: ['SMTP 451: mailbox busy', 'SMTP 452: out of storage'] },
      { maxAttempts: 2 },
    );
    await untilState(jobId, 'dead');
    await show(`#/jobs/${jobId}`);
    await waitForTestIdText(page, 'job-state', (t) => t === 'dead');
    expect(await countOf(page, '[data-testid="attempts-table"] tbody tr')).toBe(2);
    expect(await testIdText(page, 'attempt-error-1')).toBe('SMTP 451: mailbox busy');
    expect(await testIdText(page, 'attempt-error-2')).toBe('SMTP 452: out of storage');
    await page.locator('[data-testid="attempt-row-2"] summary').click();
    expect(await page.getByTestId('attempt-stack-2').isVisible()).toBe(true);
    expect(await testIdText(page, 'attempt-stack-2')).toMatch(/^Error: SMTP 452: out of storage\n\s+at /);
    expect(JSON.parse((await testIdText(page, 'job-payload'))!)).toMatchObject({ to: 'ada@example.com' });

    healed.add('detail');
    await page.getByTestId('job-retry').click();
    await waitForTestIdText(page, 'job-state', (t) => t === 'done', 'the retried job to complete on the page');
    expect(await stateOf(jobId)).toBe('done');
    expect(await page.getByTestId('job-retry').count()).toBe(0);
  });

  it('purges selected dead jobs, then retries all of them', async () => {
    const results = await main.producer.enqueueMany(
      'emails',
      [1, 2, 3, 4].map((n) => ({ payload: { n, failUntil: 'list' }, maxAttempts: 1 })),
    );
    const ids = results.map((r) => r.jobId);
    for (const id of ids) await untilState(id, 'dead');
    const [first, second, ...rest] = ids as [string, string, ...string[]];

    await show('#/queues/emails/dead');
    await waitFor(
      () => rowCount(page, ids),
      (n) => n === 4,
      { what: 'the 4 dead jobs listed' },
    );
    await page.getByTestId(`select-${first}`).check();
    await page.getByTestId(`select-${second}`).check();
    await page.getByTestId('purge-selected').click();
    await waitFor(
      () => rowCount(page, [first, second]),
      (n) => n === 0,
      { what: 'the purged rows to leave the list' },
    );
    expect([await stateOf(first), await stateOf(second)]).toEqual([null, null]);
    expect(await rowCount(page, rest)).toBe(2);

    healed.add('list');
    await page.getByTestId('retry-all').click();
    await waitFor(
      () => rowCount(page, rest),
      (n) => n === 0,
      { what: 'the retried rows to leave the list' },
    );
    for (const id of rest) await untilState(id, 'done');
  });

  it('is refused to a browser the guard does not admit: no page, no data, no action without the CSRF token', async () => {
    const stranger = await browser.newContext({ viewport: VIEWPORT });
    try {
      const strangerPage = watch(await stranger.newPage());
      const response = await strangerPage.goto(main.dashboard);
      expect(response?.status()).toBe(403);
      const html = await strangerPage.content();
      expect(html).not.toContain('sqlqueue-csrf');
      expect(html).not.toContain('emails');
      const apiResponse = await stranger.request.get(`${main.dashboard}api/overview`);
      expect(apiResponse.status()).toBe(403);
      expect(await apiResponse.text()).not.toContain('emails');
    } finally {
      await stranger.close();
    }

    // Admitted, but a POST without the page's token (as another site's form would send) is refused.
    await show('#/');
    const refused = await inPage<number>(
      page,
      `fetch('api/queues/emails/dead/retry', { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"all":true}' }).then((r) => r.status)`,
    );
    expect(refused).toBe(403);
  });

  it('read-only: shows no action and refuses a POST that carries the right CSRF token', async () => {
    const { jobId } = await main.producer.enqueue('emails', { failUntil: 'never' }, { maxAttempts: 1 });
    await untilState(jobId, 'dead');
    readOnly = await bootApp({ consume: false, guard: 'none', readOnly: true });
    const viewer = await browser.newContext({ viewport: VIEWPORT });
    try {
      const viewerPage = watch(await viewer.newPage());
      await show('#/queues/emails/dead', viewerPage, readOnly.dashboard);
      await waitFor(
        () => rowCount(viewerPage, [jobId]),
        (n) => n === 1,
        { what: 'the dead job listed' },
      );
      expect(await viewerPage.getByTestId('read-only-badge').isVisible()).toBe(true);
      for (const action of ['retry-selected', 'purge-selected', 'retry-all', 'purge-all']) {
        expect(await viewerPage.getByTestId(action).count(), action).toBe(0);
      }
      expect(await countOf(viewerPage, 'input[type="checkbox"]')).toBe(0);

      await show(`#/jobs/${jobId}`, viewerPage, readOnly.dashboard);
      await waitForTestIdText(viewerPage, 'job-state', (t) => t === 'dead');
      expect(await countOf(viewerPage, 'main button')).toBe(0);

      await show('#/schedules', viewerPage, readOnly.dashboard);
      await waitFor(
        () => countOf(viewerPage, '[data-testid="schedule-row-nightly-report"]'),
        (n) => n === 1,
        { what: 'the schedule listed' },
      );
      expect(await countOf(viewerPage, 'main button')).toBe(0);

      const attempt = await inPage<{ status: number; body: { message: string } }>(
        viewerPage,
        `(async () => {
          const token = document.querySelector('meta[name="sqlqueue-csrf"]').content;
          const response = await fetch('api/queues/emails/dead/retry', {
            method: 'POST',
            headers: { 'content-type': 'application/json', 'x-sqlqueue-csrf': token },
            body: JSON.stringify({ ids: [${JSON.stringify(jobId)}] }),
          });
          return { status: response.status, body: await response.json() };
        })()`,
      );
      expect(attempt.status).toBe(403);
      expect(attempt.body.message).toMatch(/read-only/);
      expect(await stateOf(jobId)).toBe('dead');
    } finally {
      await viewer.close();
    }
  });

  it('renders hostile payloads, errors and keys as text: nothing runs, no element is injected', async () => {
    const hostile = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=1">';
    const { jobId } = await main.producer.enqueue(
      'emails',
      { note: hostile, failUntil: 'hostile', errors: [`rejected ${hostile}`] },
      { maxAttempts: 1, idempotencyKey: `key ${hostile}`, groupKey: `group ${hostile}` },
    );
    await untilState(jobId, 'dead');

    await show(`#/jobs/${jobId}`);
    // Waits for this job's page: the page shown before may be another dead job's, whose state
    // reads 'dead' too until the new one is rendered.
    await waitForTestIdText(page, 'job-field-idempotencyKey', (t) => t === `key ${hostile}`);
    expect(await testIdText(page, 'job-state')).toBe('dead');
    expect(await testIdText(page, 'job-field-groupKey')).toBe(`group ${hostile}`);
    expect(await testIdText(page, 'attempt-error-1')).toBe(`rejected ${hostile}`);
    expect(await testIdText(page, 'job-last-error')).toBe(`rejected ${hostile}`);
    expect(JSON.parse((await testIdText(page, 'job-payload'))!)).toMatchObject({ note: hostile });
    expect(await page.getByText(`key ${hostile}`, { exact: true }).isVisible()).toBe(true);
    await expectNothingInjected(page);

    await show('#/queues/emails/dead');
    const row = await waitForTestIdText(page, `job-row-${jobId}`, (t) => t.includes('rejected'));
    expect(row).toContain(`key ${hostile}`);
    expect(row).toContain(`group ${hostile}`);
    expect(row).toContain(`rejected ${hostile}`);
    await expectNothingInjected(page);

    // And the job page's purge button removes it.
    await show(`#/jobs/${jobId}`);
    await page.getByTestId('job-purge').click();
    await waitForTestIdText(page, 'job-missing', (t) => t.includes(jobId));
    expect(await stateOf(jobId)).toBeNull();
  });

  it('pauses, resumes and triggers a schedule', async () => {
    await show('#/schedules');
    const status = () => testIdText(page, 'schedule-row-nightly-report');
    await waitFor(status, (t) => t?.includes('active') ?? false, { what: 'the schedule, active' });
    await page.getByTestId('schedule-pause-nightly-report').click();
    await waitFor(status, (t) => t?.includes('paused') ?? false, { what: 'the schedule paused' });
    await page.getByTestId('schedule-resume-nightly-report').click();
    await waitFor(status, (t) => t?.includes('active') ?? false, { what: 'the schedule resumed' });
    await page.getByTestId('schedule-trigger-nightly-report').click();
    const notice = await waitForTestIdText(page, 'notice', (t) => /enqueued job \d+/.test(t));
    const jobId = /enqueued job (\d+)/.exec(notice)![1]!;
    expect((await main.producer.getJob(jobId))?.queue).toBe('reports');
  });

  it('pauses a queue from its page, the overview marks it, and resumes it', async () => {
    await show('#/queues/reports/ready');
    await page.getByTestId('queue-pause').click();
    await waitForTestIdText(page, 'queue-paused', (t) => t === 'paused');
    expect((await main.producer.stats('reports')).paused).toBe(true);
    await show('#/');
    await waitFor(
      () => countOf(page, '[data-testid="paused-reports"]'),
      (n) => n === 1,
      { what: 'the overview marking the queue paused' },
    );
    await show('#/queues/reports/ready');
    await page.getByTestId('queue-resume').click();
    await waitFor(
      () => countOf(page, '[data-testid="queue-pause"]'),
      (n) => n === 1,
      { what: 'the pause button back' },
    );
    expect((await main.producer.stats('reports')).paused).toBe(false);
  });

  it("shows a queue's flow limits and its busiest keys on its page", async () => {
    const queue = 'tenant-exports';
    await main.store.recordQueueSettings([
      {
        queue,
        maxAttempts: 3,
        limits: { globalConcurrency: null, concurrencyPerKey: 2, rateLimit: null, rateLimitPerKey: null },
      },
    ]);
    for (const key of ['acme', 'acme', 'acme', 'globex'])
      await main.producer.enqueue(queue, {}, { concurrencyKey: key });
    await main.store.claim({ queue, limit: 10, leaseMs: 60_000, workerId: 'browser-test', limited: true });
    await show(`#/queues/${queue}/ready`);
    await waitForTestIdText(page, 'flow-facts', (t) => /Keys at their limit\s*1/.test(t));
    expect(await page.getByTestId('flow-key-acme').innerText()).toMatch(/acme\s+2\s+1/);
    expect(await page.getByTestId('flow-key-globex').innerText()).toMatch(/globex\s+1\s+0/);
  });

  it("shows a running job's progress live as its handler in another process reports it, and cancels it with Cancel", async () => {
    await createEffectTables(PG_URL, schema);
    const worker = await WorkerProcess.start({ url: PG_URL, schema, queue: 'exports', mode: 'progress', events: true });
    const { jobId } = await main.producer.enqueue('exports', { n: 1 });
    await worker.next((m) => m.type === 'started' && m.jobId === jobId);
    await show(`#/jobs/${jobId}`);
    const stepOf = (text: string) => Number(/"step":(\d+)/.exec(text)?.[1] ?? 0);
    const first = stepOf(await waitForTestIdText(page, 'job-field-progress', (t) => stepOf(t) > 0));
    // The page refreshes itself: the value moves on without a reload (at most one write a second).
    await waitForTestIdText(page, 'job-field-progress', (t) => stepOf(t) > first, 'progress to move on');
    expect(((await main.producer.getJob(jobId))!.progress as { step: number }).step).toBeGreaterThan(first);

    await page.click('[data-testid="job-cancel"]');
    expect(await worker.event('canceled', (m) => m.jobId === jobId, 10_000)).toMatchObject({ jobId });
    await untilState(jobId, 'canceled');
    await waitForTestIdText(page, 'job-field-state', (t) => t === 'canceled');
    expect(await countOf(page, '[data-testid="job-cancel"]')).toBe(0);
    await worker.stop();
  });

  it('pages through a long list with Next page and First page', async () => {
    await bulk;
    await waitFor(
      () => main.producer.stats('invoices'),
      (stats) => stats.ready + stats.delayed + stats.leased === 0,
      { what: 'every invoice done' },
    );
    const listed = () =>
      inPage<string[]>(
        page,
        `[...document.querySelectorAll('[data-testid^="job-row-"]')].map((row) => row.dataset.testid)`,
      );
    await show('#/queues/invoices/done');
    const first = await waitFor(listed, (rows) => rows.length === 50, { what: 'a first page of 50' });
    await page.getByTestId('next-page').click();
    const second = await waitFor(listed, (rows) => rows.length === 50 && !rows.includes(first[0]!), {
      what: 'a second page of 50 others',
    });
    expect(second.filter((row) => first.includes(row))).toEqual([]);
    await page.getByTestId('first-page').click();
    expect(await waitFor(listed, (rows) => rows.includes(first[0]!), { what: 'the first page again' })).toEqual(first);
  });

  it('screenshots the overview, throughput chart included, and a job page', async () => {
    const { webhookJobId, completions } = await bulk;
    await untilState(webhookJobId, 'dead');
    const expected = completions + (UPDATE_DOCS ? await backfillHourOfThroughput() : 0);
    // The chart reads minute buckets the server caches for a few seconds: wait until they hold the run.
    await waitFor(
      async () => {
        const response = await context.request.get(`${main.dashboard}api/throughput?minutes=60`);
        const body = (await response.json()) as { buckets: { completed: number }[] };
        return body.buckets.reduce((sum, b) => sum + b.completed, 0);
      },
      (completed) => completed >= expected,
      { what: `${expected} completions in the throughput`, timeoutMs: 30_000, intervalMs: 500 },
    );

    await show('#/schedules');
    await show('#/');
    await waitFor(
      () => countOf(page, '[data-testid="throughput-chart"] .bar-completed'),
      (n) => n > 0,
      { what: 'bars in the chart' },
    );
    await waitForTestIdText(page, 'count-invoices-completedLastHour', (t) => t !== '0');
    await page.mouse.move(0, 0);
    await saveScreenshot('dashboard-overview.png');

    await show(`#/jobs/${webhookJobId}`);
    await waitForTestIdText(page, 'job-state', (t) => t === 'dead');
    expect(await countOf(page, '[data-testid="attempts-table"] tbody tr')).toBe(3);
    await page.mouse.move(0, 0);
    await saveScreenshot('dashboard-job.png');
  });
});

async function expectNothingInjected(target: Page): Promise<void> {
  expect(await inPage(target, 'window.__pwned')).toBeUndefined();
  expect(await countOf(target, 'img, [onerror]')).toBe(0);
  expect(
    await inPage<number>(target, `[...document.scripts].filter((s) => !s.src.endsWith('/assets/dashboard.js')).length`),
  ).toBe(0);
}

/** test-artifacts/ always; docs/ too (the README's images) with SQLQUEUE_UPDATE_SCREENSHOTS=1. */
async function saveScreenshot(name: string): Promise<void> {
  const image = await page.screenshot({ type: 'png' });
  for (const folder of UPDATE_DOCS ? ['test-artifacts', 'docs'] : ['test-artifacts']) {
    const directory = new URL(`../../${folder}/`, import.meta.url);
    await mkdir(directory, { recursive: true });
    await writeFile(new URL(name, directory), image);
  }
}

/**
 * For the README image only: a test run lasts a minute, so the hour before it is written as a
 * steadily busy app would have recorded it, straight into the buckets the chart reads (58
 * minutes back, so that none leaves the chart's hour if the minute turns before it is read).
 */
async function backfillHourOfThroughput(): Promise<number> {
  const shapes = { emails: 60, invoices: 35, webhooks: 25 } as const;
  let completed = 0;
  for (const [queue, base] of Object.entries(shapes)) {
    const rows = await sql<{ completed: number | string }>(
      PG_URL,
      `INSERT INTO "${schema}".throughput (minute, queue, completed, failed, dead)
       SELECT date_trunc('minute', now()) - make_interval(mins => m), $1,
              round($2 * (1.0 + 0.45 * sin(m / 7.0) + 0.25 * sin(m * 1.7)))::int,
              CASE WHEN m % 11 = 3 THEN 2 + m % 4 ELSE 0 END,
              CASE WHEN m % 23 = 5 THEN 1 ELSE 0 END
       FROM generate_series(1, 58) AS m
       ON CONFLICT DO NOTHING
       RETURNING completed`,
      [queue, base],
    );
    completed += rows.reduce((sum, row) => sum + Number(row.completed), 0);
  }
  return completed;
}
