import type { CanActivate, ModuleMetadata, Type } from '@nestjs/common';
import { SqlQueueConfigError } from '../core/errors.js';
import { assertBoolean, assertInteger, assertOptionGroup, describe } from '../core/validation.js';

/** Options of `SqlQueueDashboardModule.forRoot()`. */
export interface SqlQueueDashboardOptions {
  /**
   * Where the page and its API are served (default '/queues'), under the application's global
   * prefix if it sets one: '/' then segments of letters, digits, '.', '_', '~', '-' (not '/' alone).
   */
  path?: string;
  /**
   * Who may see and act: a Nest guard (a CanActivate class, resolved in the dashboard's module,
   * or an instance) run before every page, asset and API request; or 'none', said explicitly,
   * for an application that protects the path itself. Required.
   */
  guard: Type<CanActivate> | CanActivate | 'none';
  /**
   * Modules the guard class needs for its own dependencies (e.g. your AuthModule exporting the
   * service it calls); global modules need no listing.
   */
  imports?: ModuleMetadata['imports'];
  /** Shows everything and refuses every action: retry, purge, pause, resume, trigger (default false). */
  readOnly?: boolean;
  /** How often the page refreshes the overview and the list shown, in milliseconds (500..60000, default 2000). */
  refreshMs?: number;
}

export interface ResolvedDashboardOptions {
  path: string;
  guard: Type<CanActivate> | CanActivate | 'none';
  imports: NonNullable<ModuleMetadata['imports']>;
  readOnly: boolean;
  refreshMs: number;
}

/** The resolved options of one SqlQueueDashboardModule.forRoot(). */
export const SQL_QUEUE_DASHBOARD_OPTIONS = Symbol('SQL_QUEUE_DASHBOARD_OPTIONS');

const KNOWN: readonly (keyof SqlQueueDashboardOptions)[] = ['path', 'guard', 'imports', 'readOnly', 'refreshMs'];
const WHERE = 'SqlQueueDashboardModule';
const SEGMENT = /^[A-Za-z0-9._~-]+$/;

/** Checks every option at boot, with messages that name the option and the fix. */
export function resolveDashboardOptions(raw: SqlQueueDashboardOptions): ResolvedDashboardOptions {
  if (raw === undefined || raw === null) throw new SqlQueueConfigError(missingGuard());
  assertOptionGroup(`${WHERE} options`, raw, KNOWN);
  return {
    path: assertMountPath(raw.path ?? '/queues'),
    guard: assertGuard(raw.guard),
    imports: assertImports(raw.imports),
    readOnly: assertBoolean(`${WHERE}: readOnly`, raw.readOnly ?? false),
    refreshMs: assertInteger(`${WHERE}: refreshMs`, raw.refreshMs ?? 2000, 500, 60_000),
  };
}

function missingGuard(): string {
  return `${WHERE}: guard is required: pass guard: YourAuthGuard (a CanActivate class or instance) to decide who may see and retry or purge jobs, or guard: 'none' if the application protects the path itself`;
}

function assertGuard(guard: unknown): ResolvedDashboardOptions['guard'] {
  if (guard === undefined || guard === null) throw new SqlQueueConfigError(missingGuard());
  if (guard === 'none') return guard;
  const isClass = typeof guard === 'function' && typeof (guard.prototype as CanActivate)?.canActivate === 'function';
  const isInstance = typeof guard === 'object' && typeof (guard as CanActivate).canActivate === 'function';
  if (!isClass && !isInstance) {
    throw new SqlQueueConfigError(
      `${WHERE}: guard must be a CanActivate class or instance, or 'none', got ${describe(guard)}${typeof guard === 'function' ? ' (a function without canActivate)' : ''}`,
    );
  }
  return guard as Type<CanActivate> | CanActivate;
}

function assertImports(imports: unknown): ResolvedDashboardOptions['imports'] {
  if (imports === undefined) return [];
  if (!Array.isArray(imports)) {
    throw new SqlQueueConfigError(`${WHERE}: imports must be an array of modules, got ${describe(imports)}`);
  }
  return imports as ResolvedDashboardOptions['imports'];
}

function assertMountPath(path: unknown): string {
  const fix = `start with '/', then segments of letters, digits, '.', '_', '~', '-' separated by '/', without a trailing '/' (e.g. '/queues' or '/admin/jobs')`;
  if (typeof path !== 'string' || !path.startsWith('/') || path.length > 200) {
    throw new SqlQueueConfigError(`${WHERE}: path ${describe(path)} is invalid: ${fix}`);
  }
  // Not '/': the dashboard would share the application's root with its own routes.
  const segments = path.slice(1).split('/');
  if (segments.some((segment) => !SEGMENT.test(segment) || segment === '.' || segment === '..')) {
    throw new SqlQueueConfigError(`${WHERE}: path ${describe(path)} is invalid: ${fix}`);
  }
  return path;
}
