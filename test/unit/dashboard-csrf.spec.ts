import { describe, expect, it } from 'vitest';
import {
  csrfCookie,
  csrfProblem,
  csrfTokenOf,
  newCsrfToken,
  readCookie,
} from '../../lib/src/dashboard/dashboard.csrf.js';

describe('dashboard CSRF', () => {
  const token = newCsrfToken();
  const other = newCsrfToken();
  const cookie = `theme=dark; sqlqueue_csrf=${token}; other=1`;

  it('makes distinct 43-character base64url tokens and a strict, HttpOnly cookie scoped to the mount', () => {
    expect(token).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect(other).not.toBe(token);
    expect(csrfCookie(token, '/admin/queues/')).toBe(
      `sqlqueue_csrf=${token}; Path=/admin/queues/; HttpOnly; SameSite=Strict`,
    );
  });

  it('reads cookies by hand, quoted or not, and reuses only a well-formed token', () => {
    expect(readCookie(cookie, 'other')).toBe('1');
    expect(readCookie('a="b c"', 'a')).toBe('b c');
    expect(readCookie('xsqlqueue_csrf=1', 'sqlqueue_csrf')).toBeNull();
    expect(readCookie(undefined, 'a')).toBeNull();
    expect(csrfTokenOf({ cookie })).toBe(token);
    expect(csrfTokenOf({ cookie: 'sqlqueue_csrf=short' })).toBeNull();
  });

  it('accepts the header equal to the cookie, from no origin or this host', () => {
    expect(csrfProblem({ cookie, 'x-sqlqueue-csrf': token })).toBeNull();
    expect(
      csrfProblem({ cookie, 'x-sqlqueue-csrf': token, origin: 'http://Example.com:8080', host: 'example.com:8080' }),
    ).toBeNull();
  });

  it('refuses a missing or different token, a repeated header, and a foreign or opaque origin', () => {
    expect(csrfProblem({ cookie })).toMatch(/^missing or invalid CSRF token/);
    expect(csrfProblem({ 'x-sqlqueue-csrf': token })).toMatch(/^missing or invalid CSRF token/);
    expect(csrfProblem({ cookie, 'x-sqlqueue-csrf': other })).toMatch(/^missing or invalid CSRF token/);
    expect(csrfProblem({ cookie, 'x-sqlqueue-csrf': [token, token] })).toMatch(/^missing or invalid CSRF token/);
    const host = 'example.com';
    expect(csrfProblem({ cookie, 'x-sqlqueue-csrf': token, origin: 'https://evil.test', host })).toMatch(
      /from origin "https:\/\/evil.test", not from this host/,
    );
    expect(csrfProblem({ cookie, 'x-sqlqueue-csrf': token, origin: 'null', host })).toMatch(/from origin "null"/);
  });

  it("trusts the browser's Sec-Fetch-Site over hosts, and knows a proxy's and HTTP/2's host names", () => {
    const sent = { cookie, 'x-sqlqueue-csrf': token };
    // Behind a proxy that rewrites Host: the browser's own word, or the forwarded host.
    expect(
      csrfProblem({ ...sent, 'sec-fetch-site': 'same-origin', origin: 'https://q.example', host: 'app:3000' }),
    ).toBeNull();
    expect(
      csrfProblem({ ...sent, origin: 'https://q.example', host: 'app:3000', 'x-forwarded-host': 'q.example, lb' }),
    ).toBeNull();
    expect(csrfProblem({ ...sent, origin: 'https://q.example', ':authority': 'q.example' })).toBeNull();
    for (const site of ['same-site', 'cross-site', 'none']) {
      expect(csrfProblem({ ...sent, 'sec-fetch-site': site, origin: 'https://q.example', host: 'q.example' })).toMatch(
        /comes from another site \(Sec-Fetch-Site/,
      );
    }
    // A token is still required whatever the browser says.
    expect(csrfProblem({ cookie, 'sec-fetch-site': 'same-origin' })).toMatch(/^missing or invalid CSRF token/);
  });
});
