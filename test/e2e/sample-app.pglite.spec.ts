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
  sample = await startSampleApp({ SAMPLE_DATA_DIR: 'memory://', METRICS_CACHE_MS: '0' });
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
});
