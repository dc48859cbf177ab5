import { Logger } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { loadConfig } from './app.config.js';
import { AppModule } from './app.module.js';

/**
 * `npm start`: with no configuration it runs on an embedded PostgreSQL (PGlite) in
 * sample-app/.data; set SQLQUEUE_URL for a real PostgreSQL or SQL Server.
 */
async function bootstrap(): Promise<void> {
  const config = loadConfig();
  const app = await NestFactory.create(AppModule.forRoot(config));
  // SIGTERM from Kubernetes: stop claiming, let running handlers finish, then close connections.
  app.enableShutdownHooks();
  await app.listen(config.port);
  const url = (await app.getUrl()).replace('[::1]', 'localhost');
  new Logger('SampleApp').log(
    `listening on ${url}: POST /emails, POST /signups, GET /emails/sent, GET /queues/emails/stats, GET /health/live, GET /health/ready, GET /metrics, dashboard GET /queues/`,
  );
}

bootstrap().catch((error: unknown) => {
  new Logger('SampleApp').error(error instanceof Error ? (error.stack ?? error.message) : String(error));
  process.exit(1);
});
