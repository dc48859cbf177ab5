import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { SqlQueueConfigError } from '../../lib/src/core/errors.js';
import { DASHBOARD_ASSETS_URL, DashboardAssets } from '../../lib/src/dashboard/dashboard.assets.js';

const fixture = mkdtempSync(join(tmpdir(), 'sqlqueue-dashboard-'));
afterAll(() => rmSync(fixture, { recursive: true, force: true }));
const fixtureUrl = pathToFileURL(`${fixture}/`).href;

describe('dashboard assets', () => {
  it('the shipped page carries every placeholder the server fills', () => {
    const html = readFileSync(new URL('index.html', DASHBOARD_ASSETS_URL), 'utf8');
    for (const placeholder of ['%BASE_HREF%', '%CSRF_TOKEN%', '%READ_ONLY%', '%REFRESH_MS%']) {
      expect(html, placeholder).toContain(placeholder);
    }
  });

  it('fills placeholders in one pass, each value HTML-escaped', async () => {
    writeFileSync(
      join(fixture, 'index.html'),
      '<base href="%BASE_HREF%"><p>%CSRF_TOKEN%|%READ_ONLY%|%REFRESH_MS%|%OTHER%</p>',
    );
    writeFileSync(join(fixture, 'dashboard.js'), 'export {};');
    writeFileSync(join(fixture, 'dashboard.css'), 'body {}');
    const assets = await DashboardAssets.load(fixtureUrl);
    expect(
      assets.page({
        baseHref: `/a"><script>x('&')</script>/`,
        csrfToken: '%BASE_HREF%',
        readOnly: true,
        refreshMs: 500,
      }),
    ).toBe(
      '<base href="/a&quot;&gt;&lt;script&gt;x(&#39;&amp;&#39;)&lt;/script&gt;/"><p>%BASE_HREF%|true|500|%OTHER%</p>',
    );
    expect(assets.asset('dashboard.js')).toEqual({ body: 'export {};', contentType: 'text/javascript; charset=utf-8' });
    expect(assets.asset('dashboard.css')?.contentType).toBe('text/css; charset=utf-8');
    expect(assets.asset('index.html')).toBeNull();
    expect(assets.asset('../dashboard.js')).toBeNull();
  });

  it('a missing file fails the boot, naming where it was looked for', async () => {
    rmSync(join(fixture, 'dashboard.css'));
    const failure = DashboardAssets.load(fixtureUrl);
    await expect(failure).rejects.toBeInstanceOf(SqlQueueConfigError);
    await expect(failure).rejects.toThrow(`cannot read its asset ${join(fixture, 'dashboard.css')}`);
  });
});
