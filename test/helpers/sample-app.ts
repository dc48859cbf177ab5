import type { INestApplication } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { loadConfig } from '../../sample-app/src/app.config.js';
import { AppModule } from '../../sample-app/src/app.module.js';
import { CaptureLogger } from './capture-logger.js';

export interface RunningSampleApp {
  app: INestApplication;
  /** http://127.0.0.1:<port> */
  url: string;
  logger: CaptureLogger;
  /** fetch relative to the app; JSON bodies are sent with the right content type. */
  request(
    path: string,
    init?: { method?: string; body?: unknown; headers?: Record<string, string> },
  ): Promise<Response>;
  close(): Promise<void>;
}

/**
 * Boots the sample app's real AppModule in this process, configured from `env` exactly as
 * `npm start` is from the environment, on a free port, and talks to it over HTTP.
 */
export async function startSampleApp(env: Record<string, string>): Promise<RunningSampleApp> {
  const logger = new CaptureLogger();
  const config = loadConfig({ ...env, PORT: '0' });
  const app = await NestFactory.create(AppModule.forRoot(config), { logger, abortOnError: false });
  await app.listen(0, '127.0.0.1');
  const server = app.getHttpServer() as { address(): { port: number } };
  const url = `http://127.0.0.1:${server.address().port}`;
  return {
    app,
    url,
    logger,
    request: (path, init = {}) =>
      fetch(`${url}${path}`, {
        method: init.method ?? (init.body === undefined ? 'GET' : 'POST'),
        headers: { ...(init.body === undefined ? {} : { 'content-type': 'application/json' }), ...init.headers },
        body: init.body === undefined ? undefined : JSON.stringify(init.body),
        // Probes must answer on their own; this only stops a broken test from hanging.
        signal: AbortSignal.timeout(20_000),
      }),
    close: () => app.close(),
  };
}
