import {
  type ArgumentsHost,
  type CallHandler,
  Catch,
  type ExceptionFilter,
  type ExecutionContext,
  HttpException,
  Inject,
  Injectable,
  type NestInterceptor,
} from '@nestjs/common';
import { HttpAdapterHost } from '@nestjs/core';
import type { Observable } from 'rxjs';
import { SqlQueueValidationError } from '../core/errors.js';

/**
 * The HTTP side shared by the dashboard's routes, for Express and Fastify alike: requests and
 * responses are only touched through Nest's HTTP adapter (setHeader, reply, getRequestUrl)
 * and the `headers` both request types carry.
 */
export interface DashboardRequest {
  headers: Record<string, string | string[] | undefined>;
}

/** The page loads only its own files; nothing is framed, sniffed or cached by the way. */
const SECURITY_HEADERS: Readonly<Record<string, string>> = {
  'Content-Security-Policy':
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'self'; form-action 'self'; frame-ancestors 'none'",
  'X-Content-Type-Options': 'nosniff',
  'Referrer-Policy': 'same-origin',
  'Cache-Control': 'no-store',
};

export function setHeaders(adapterHost: HttpAdapterHost, response: unknown, headers: Record<string, string>): void {
  const adapter = adapterHost.httpAdapter;
  for (const [name, value] of Object.entries(headers)) adapter.setHeader(response, name, value);
}

/** Sets the security headers (and no-store) on every dashboard response, before its handler runs. */
@Injectable()
export class DashboardHeadersInterceptor implements NestInterceptor {
  constructor(@Inject(HttpAdapterHost) private readonly adapterHost: HttpAdapterHost) {}

  intercept(context: ExecutionContext, next: CallHandler): Observable<unknown> {
    setHeaders(this.adapterHost, context.switchToHttp().getResponse(), SECURITY_HEADERS);
    return next.handle();
  }
}

/**
 * Answers the dashboard's refusals as JSON `{ statusCode, message, error }` with the same
 * headers as its other responses: HTTP errors (the guard's 403 included, which no interceptor
 * sees) as they are, and invalid input (SqlQueueValidationError, from the service or the
 * queue's API) as a 400. Other errors are left to the application's filters.
 */
@Catch(SqlQueueValidationError, HttpException)
export class DashboardExceptionFilter implements ExceptionFilter {
  constructor(@Inject(HttpAdapterHost) private readonly adapterHost: HttpAdapterHost) {}

  catch(exception: SqlQueueValidationError | HttpException, host: ArgumentsHost): void {
    const response = host.switchToHttp().getResponse<unknown>();
    setHeaders(this.adapterHost, response, SECURITY_HEADERS);
    if (exception instanceof SqlQueueValidationError) {
      this.adapterHost.httpAdapter.reply(
        response,
        { statusCode: 400, message: exception.message, error: 'Bad Request' },
        400,
      );
      return;
    }
    const status = exception.getStatus();
    const body = exception.getResponse();
    this.adapterHost.httpAdapter.reply(
      response,
      typeof body === 'string' ? { statusCode: status, message: body } : body,
      status,
    );
  }
}
