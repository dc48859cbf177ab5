import { randomBytes, timingSafeEqual } from 'node:crypto';

/**
 * Double-submit CSRF protection for the dashboard's actions: the page carries a random token
 * in its markup and in an HttpOnly, SameSite=Strict cookie scoped to the mount path; an action
 * must send the token back in a header. Another site can make a browser send the cookie, but
 * can neither read the token nor set a custom header without a CORS preflight.
 */
export const CSRF_COOKIE = 'sqlqueue_csrf';
export const CSRF_HEADER = 'x-sqlqueue-csrf';

/** 32 random bytes in base64url: 43 characters. */
const TOKEN = /^[A-Za-z0-9_-]{43}$/;

type Headers = Record<string, string | string[] | undefined>;

export function newCsrfToken(): string {
  return randomBytes(32).toString('base64url');
}

/** The token of the request's cookie when it is one of ours, so that open tabs keep working. */
export function csrfTokenOf(headers: Headers): string | null {
  const token = readCookie(header(headers, 'cookie'), CSRF_COOKIE);
  return token !== null && TOKEN.test(token) ? token : null;
}

/** The Set-Cookie value for `token`, sent only with requests under `path`. */
export function csrfCookie(token: string, path: string): string {
  return `${CSRF_COOKIE}=${token}; Path=${path}; HttpOnly; SameSite=Strict`;
}

/**
 * Why an action request must be refused, or null: the header must equal the cookie (compared
 * in constant time), and the request must come from the page's own origin: the browser's
 * Sec-Fetch-Site says so when it sends one (no page can forge it); otherwise an Origin header,
 * when sent, must name this host as the browser saw it (Host, or behind a proxy that rewrites
 * it, X-Forwarded-Host; HTTP/2's :authority).
 */
export function csrfProblem(headers: Headers): string | null {
  const refused = 'missing or invalid CSRF token: reload the dashboard page and try again';
  const cookie = csrfTokenOf(headers);
  const sent = header(headers, CSRF_HEADER);
  if (cookie === null || sent === undefined || !TOKEN.test(sent)) return refused;
  // Both are 43 ASCII characters here, so the buffers have equal lengths.
  if (!timingSafeEqual(Buffer.from(sent), Buffer.from(cookie))) return refused;
  const site = header(headers, 'sec-fetch-site');
  if (site !== undefined) {
    return site === 'same-origin'
      ? null
      : `missing or invalid CSRF token: the browser says the request comes from another site (Sec-Fetch-Site: ${JSON.stringify(site.slice(0, 20))})`;
  }
  const origin = header(headers, 'origin');
  if (origin !== undefined && !hostsOf(headers).includes(originHost(origin) ?? '')) {
    return `missing or invalid CSRF token: the request comes from origin ${JSON.stringify(origin.slice(0, 100))}, not from this host`;
  }
  return null;
}

/** The names this server answers to for the request: Host, a proxy's X-Forwarded-Host, HTTP/2's :authority. */
function hostsOf(headers: Headers): string[] {
  const forwarded = header(headers, 'x-forwarded-host')?.split(',')[0];
  return [header(headers, 'host'), forwarded, header(headers, ':authority')]
    .filter((host): host is string => !!host)
    .map((host) => host.trim().toLowerCase());
}

function originHost(origin: string): string | null {
  try {
    return new URL(origin).host.toLowerCase() || null;
  } catch {
    return null;
  }
}

/** One header's value; a repeated header is refused as absent (a token is never a list). */
function header(headers: Headers, name: string): string | undefined {
  const value = headers[name];
  return typeof value === 'string' ? value : undefined;
}

/** A cookie's value from a Cookie header, parsed by hand: `name=value` pairs separated by ';'. */
export function readCookie(cookieHeader: string | undefined, name: string): string | null {
  if (!cookieHeader) return null;
  for (const pair of cookieHeader.split(';')) {
    const at = pair.indexOf('=');
    if (at < 0 || pair.slice(0, at).trim() !== name) continue;
    let value = pair.slice(at + 1).trim();
    if (value.length >= 2 && value.startsWith('"') && value.endsWith('"')) value = value.slice(1, -1);
    return value;
  }
  return null;
}
