import { type CanActivate, Injectable } from '@nestjs/common';
import { describe, expect, it } from 'vitest';
import { SqlQueueConfigError } from '../../lib/src/core/errors.js';
import { SqlQueueDashboardModule, type SqlQueueDashboardOptions } from '../../lib/src/dashboard.js';
import { resolveDashboardOptions } from '../../lib/src/dashboard/dashboard.options.js';

@Injectable()
class AllowAll implements CanActivate {
  canActivate(): boolean {
    return true;
  }
}

const refused = (options: unknown) => {
  try {
    resolveDashboardOptions(options as SqlQueueDashboardOptions);
  } catch (error) {
    expect(error).toBeInstanceOf(SqlQueueConfigError);
    return (error as Error).message;
  }
  throw new Error('the options were accepted');
};

describe('dashboard options', () => {
  it('defaults: /queues, writable, a 2 s refresh; the guard is kept as given', () => {
    expect(resolveDashboardOptions({ guard: AllowAll })).toEqual({
      path: '/queues',
      guard: AllowAll,
      imports: [],
      readOnly: false,
      refreshMs: 2000,
    });
    const instance = new AllowAll();
    expect(
      resolveDashboardOptions({ guard: instance, path: '/admin/jobs.v2', readOnly: true, refreshMs: 500 }),
    ).toEqual({ path: '/admin/jobs.v2', guard: instance, imports: [], readOnly: true, refreshMs: 500 });
  });

  it('a missing guard fails the boot, naming both choices', () => {
    for (const options of [undefined, {}, { guard: undefined }, { path: '/queues' }]) {
      const message = refused(options);
      expect(message).toContain('guard is required');
      expect(message).toContain('CanActivate class or instance');
      expect(message).toContain("guard: 'none'");
    }
    expect(() => SqlQueueDashboardModule.forRoot({} as SqlQueueDashboardOptions)).toThrow(/guard is required/);
  });

  it('refuses a guard that cannot activate', () => {
    expect(refused({ guard: 'None' })).toMatch(/guard must be a CanActivate class or instance, or 'none', got 'None'/);
    expect(refused({ guard: () => true })).toMatch(/a function without canActivate/);
    expect(refused({ guard: { canActivate: true } })).toMatch(/got an object/);
  });

  it('refuses paths that are not plain segments', () => {
    for (const path of ['/', 'queues', '/queues/', '/a//b', '/a/../b', '/a/./b', '/a b', '/a?b', '/a%2Fb', '', 42]) {
      expect(refused({ guard: 'none', path })).toMatch(/path .* is invalid: start with '\/'/);
    }
  });

  it('refuses a refresh outside 500..60000 ms, a non-boolean readOnly and unknown keys with a guess', () => {
    expect(refused({ guard: 'none', refreshMs: 100 })).toBe(
      'SqlQueueDashboardModule: refreshMs must be an integer from 500 to 60000, got 100',
    );
    expect(refused({ guard: 'none', imports: {} })).toMatch(/imports must be an array of modules, got an object/);
    expect(refused({ guard: 'none', readOnly: 'yes' })).toMatch(/readOnly must be true or false, got 'yes'/);
    expect(refused({ guard: 'none', readonly: true })).toBe(
      "SqlQueueDashboardModule options: unknown option 'readonly' (did you mean 'readOnly'?); valid options: path, guard, imports, readOnly, refreshMs",
    );
  });
});
