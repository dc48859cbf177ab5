import { createHash, timingSafeEqual } from 'node:crypto';
import {
  ForbiddenException,
  Inject,
  Injectable,
  Logger,
  UnauthorizedException,
  type CanActivate,
  type ExecutionContext,
  type OnApplicationBootstrap,
} from '@nestjs/common';
import { SAMPLE_CONFIG, type SampleConfig } from '../app.config.js';

/** Where AppModule mounts the queue dashboard. */
export const DASHBOARD_PATH = '/queues';

interface HttpRequest {
  headers: Record<string, string | string[] | undefined>;
}

interface HttpResponse {
  setHeader(name: string, value: string): unknown;
}

/**
 * A demo of the dashboard's `guard` option: HTTP Basic authentication against
 * DASHBOARD_PASSWORD (any user name). The browser asks once, then sends the credentials with
 * every request of the page, its API calls included. A real application would use its own
 * authentication (session, SSO) and check a role here instead.
 */
@Injectable()
export class DashboardBasicAuthGuard implements CanActivate {
  constructor(@Inject(SAMPLE_CONFIG) private readonly config: SampleConfig) {}

  canActivate(context: ExecutionContext): boolean {
    const password = this.config.dashboardPassword;
    if (!password) {
      throw new ForbiddenException('the queue dashboard is disabled: set DASHBOARD_PASSWORD to enable it');
    }
    const http = context.switchToHttp();
    if (sameSecret(basicPassword(http.getRequest<HttpRequest>().headers.authorization), password)) return true;
    // The challenge makes the browser show its sign-in prompt.
    http.getResponse<HttpResponse>().setHeader('WWW-Authenticate', 'Basic realm="queues", charset="UTF-8"');
    throw new UnauthorizedException('sign in with any user name and the DASHBOARD_PASSWORD password');
  }
}

/** The password of an `Authorization: Basic …` header, or null. */
function basicPassword(header: string | string[] | undefined): string | null {
  const match = typeof header === 'string' ? /^Basic\s+([A-Za-z0-9+/=]+)$/i.exec(header.trim()) : null;
  if (!match) return null;
  const decoded = Buffer.from(match[1]!, 'base64').toString('utf8');
  const colon = decoded.indexOf(':');
  return colon < 0 ? null : decoded.slice(colon + 1);
}

/** Compared in constant time (over digests, so the length leaks nothing either). */
function sameSecret(given: string | null, expected: string): boolean {
  if (given === null) return false;
  const digest = (value: string) => createHash('sha256').update(value, 'utf8').digest();
  return timingSafeEqual(digest(given), digest(expected));
}

/** Says once at boot whether the dashboard is open, and how to open it. */
@Injectable()
export class DashboardAccessNotice implements OnApplicationBootstrap {
  private readonly logger = new Logger('SampleApp');

  constructor(@Inject(SAMPLE_CONFIG) private readonly config: SampleConfig) {}

  onApplicationBootstrap(): void {
    if (this.config.dashboardPassword) {
      this.logger.log(`queue dashboard at ${DASHBOARD_PATH}/ (HTTP Basic: any user name, DASHBOARD_PASSWORD)`);
    } else {
      this.logger.warn(
        `queue dashboard at ${DASHBOARD_PATH}/ is disabled: set DASHBOARD_PASSWORD to enable it (HTTP Basic, any user name)`,
      );
    }
  }
}
