import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parsePrometheusText, sampleValue } from '../helpers/prometheus-text.js';
import { startSampleApp, type RunningSampleApp } from '../helpers/sample-app.js';
import { waitFor } from '../helpers/wait-for.js';

/**
 * The zero-setup path of `npm start`: no SQLQUEUE_URL, so the app runs on an embedded
 * PostgreSQL (PGlite), here in memory instead of sample-app/.data.
 */
let sample: RunningSampleApp;

beforeAll(async () => {
  sample = await startSampleApp({ SAMPLE_DATA_DIR: 'memory://', METRICS_CACHE_MS: '0', DASHBOARD_PASSWORD: 'pw-1' });
});

afterAll(async () => {
  await sample?.close();
});

describe('sample app on PGlite (no database URL)', () => {
  it('runs the whole flow: enqueue, transactional signup, send once, health and metrics', async () => {
    const post = (path: string, body: unknown, headers?: Record<string, string>) =>
      sample.request(path, { body, headers });
    const first = await post('/emails', { to: 'pg@example.com', subject: 'Lite' }, { 'Idempotency-Key': 'lite-1' });
    expect(first.status).toBe(202);
    const again = await post('/emails', { to: 'pg@example.com', subject: 'Lite' }, { 'Idempotency-Key': 'lite-1' });
    expect(((await again.json()) as { created: boolean }).created).toBe(false);
    const signup = await post('/signups', { email: 'lite@example.com', name: 'Lite' });
    expect(signup.status).toBe(201);
    const { signupId } = (await signup.json()) as { signupId: string };
    expect((await post('/signups', { email: 'lite@example.com', name: 'Twice' })).status).toBe(409);

    const sent = await waitFor(
      async () => (await (await sample.request('/emails/sent')).json()) as { idempotencyKey: string }[],
      (rows) => rows.length >= 2,
      { what: 'both emails to be sent' },
    );
    expect(sent.map((r) => r.idempotencyKey).sort()).toEqual(['lite-1', `welcome:${signupId}`]);

    expect((await sample.request('/health/live')).status).toBe(200);
    expect((await sample.request('/health/ready')).status).toBe(200);
    const stats = (await (await sample.request('/queues/emails/stats')).json()) as { stats: { ready: number } };
    expect(stats.stats.ready).toBe(0);
    const metrics = parsePrometheusText(await (await sample.request('/metrics')).text());
    expect(sampleValue(metrics, 'sqlqueue_stats_up')).toBe(1);
    expect(sampleValue(metrics, 'sqlqueue_jobs_completed_total', { queue: 'emails' })).toBe(2);
  });

  it('serves the queue dashboard at /queues/ behind HTTP Basic with DASHBOARD_PASSWORD', async () => {
    const basic = (password: string) => ({
      authorization: `Basic ${Buffer.from(`ops:${password}`).toString('base64')}`,
    });
    const anonymous = await sample.request('/queues/api/overview');
    expect(anonymous.status).toBe(401);
    expect(anonymous.headers.get('www-authenticate')).toMatch(/^Basic realm="queues"/);
    expect(await anonymous.text()).not.toContain('"queues"');
    expect((await sample.request('/queues/', { headers: basic('wrong') })).status).toBe(401);

    const page = await sample.request('/queues/', { headers: basic('pw-1') });
    expect(page.status).toBe(200);
    expect(await page.text()).toContain('<base href="/queues/"');
    const overview = (await (await sample.request('/queues/api/overview', { headers: basic('pw-1') })).json()) as {
      queues: { queue: string }[];
    };
    expect(overview.queues.map((q) => q.queue)).toContain('emails');
    // The app's own route under the same prefix stays as it was, outside the dashboard's guard.
    expect((await sample.request('/queues/emails/stats')).status).toBe(200);
    expect(sample.logger.matching(/queue dashboard at \/queues\/ \(HTTP Basic/)).toHaveLength(1);
  });
});
