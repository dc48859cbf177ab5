import { readFile } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';
import { SqlQueueConfigError } from '../core/errors.js';

/**
 * The page's files, shipped inside the package (the build copies them next to this module), so
 * the dashboard works offline and needs no CDN. The same URL works from the TypeScript source.
 * A string, not a URL object: the declarations would otherwise name Node's 'url' module.
 */
export const DASHBOARD_ASSETS_URL: string = new URL('./assets/', import.meta.url).href;

/** The files a browser may fetch under `<path>/assets/`, with their content types: nothing else is served. */
const SERVED: Readonly<Record<string, string>> = {
  'dashboard.js': 'text/javascript; charset=utf-8',
  'dashboard.css': 'text/css; charset=utf-8',
};

/** Values put into index.html, each HTML-escaped. */
export interface DashboardPageValues {
  baseHref: string;
  csrfToken: string;
  readOnly: boolean;
  refreshMs: number;
}

export interface DashboardAsset {
  body: string;
  contentType: string;
}

/** The page template and its assets, read once at boot. */
export class DashboardAssets {
  private constructor(
    private readonly template: string,
    private readonly files: ReadonlyMap<string, DashboardAsset>,
  ) {}

  /** Reads every file; a missing one fails the boot with the place it was looked for. */
  static async load(directory: string = DASHBOARD_ASSETS_URL): Promise<DashboardAssets> {
    const read = async (name: string) => {
      const url = new URL(name, directory);
      try {
        return await readFile(url, 'utf8');
      } catch (error) {
        throw new SqlQueueConfigError(
          `SqlQueueDashboardModule: cannot read its asset ${fileURLToPath(url)} (${(error as Error).message}): the package is incomplete, reinstall nestjs-sql-queue`,
          { cause: error },
        );
      }
    };
    const names = Object.keys(SERVED);
    const [template, ...bodies] = await Promise.all([read('index.html'), ...names.map(read)]);
    return new DashboardAssets(
      template!,
      new Map(names.map((name, i) => [name, { body: bodies[i]!, contentType: SERVED[name]! }])),
    );
  }

  /** An allow-listed asset by file name, or null. */
  asset(name: string): DashboardAsset | null {
    return this.files.get(name) ?? null;
  }

  /** index.html with its placeholders replaced in one pass, so a value can never introduce another. */
  page(values: DashboardPageValues): string {
    const replacements: Record<string, string> = {
      BASE_HREF: values.baseHref,
      CSRF_TOKEN: values.csrfToken,
      READ_ONLY: String(values.readOnly),
      REFRESH_MS: String(values.refreshMs),
    };
    return this.template.replace(/%(BASE_HREF|CSRF_TOKEN|READ_ONLY|REFRESH_MS)%/g, (_, key: string) =>
      escapeHtml(replacements[key]!),
    );
  }
}

const ESCAPES: Readonly<Record<string, string>> = {
  '&': '&amp;',
  '<': '&lt;',
  '>': '&gt;',
  '"': '&quot;',
  "'": '&#39;',
};

/** Text safe inside an element or a quoted attribute. */
export function escapeHtml(text: string): string {
  return text.replace(/[&<>"']/g, (c) => ESCAPES[c]!);
}
