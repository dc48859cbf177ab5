import { existsSync } from 'node:fs';
import { chromium, type Browser, type Page } from 'playwright-core';
import { waitFor } from './wait-for.js';

/** Debian's Chromium; the tests never download a browser. */
export const CHROMIUM_PATH = '/usr/bin/chromium';

/**
 * Whether the browser tests run: they skip where Chromium is missing, unless
 * SQLQUEUE_REQUIRE_BROWSER=1 (CI), where a missing browser fails them instead.
 */
export const browserTestsEnabled = existsSync(CHROMIUM_PATH) || process.env.SQLQUEUE_REQUIRE_BROWSER === '1';

/** Headless Chromium without the background traffic a desktop browser makes (updates, sync, QUIC). */
export async function launchChromium(): Promise<Browser> {
  if (!existsSync(CHROMIUM_PATH)) {
    throw new Error(
      `SQLQUEUE_REQUIRE_BROWSER=1 but ${CHROMIUM_PATH} is missing: install it (apt-get install chromium) or unset the variable to skip the browser tests`,
    );
  }
  return chromium.launch({
    executablePath: CHROMIUM_PATH,
    headless: true,
    args: [
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
  });
}

/** Runs `expression` in the page (a string: the tests are typed without the DOM library). */
export function inPage<T>(page: Page, expression: string): Promise<T> {
  return page.evaluate(expression) as Promise<T>;
}

/** The text of the element with this data-testid now, or null when there is none (no waiting). */
export function testIdText(page: Page, testId: string): Promise<string | null> {
  const selector = JSON.stringify(`[data-testid="${testId}"]`);
  return inPage(page, `document.querySelector(${selector})?.textContent ?? null`);
}

/** How many elements match `selector` now. */
export function countOf(page: Page, selector: string): Promise<number> {
  return inPage(page, `document.querySelectorAll(${JSON.stringify(selector)}).length`);
}

/** Waits until the text of the element with this data-testid is accepted, and returns it. */
export async function waitForTestIdText(
  page: Page,
  testId: string,
  accept: (text: string) => boolean,
  what = `[data-testid=${testId}]`,
): Promise<string> {
  const text = await waitFor(
    () => testIdText(page, testId),
    (value) => value !== null && accept(value),
    { what, intervalMs: 50 },
  );
  return text!;
}
