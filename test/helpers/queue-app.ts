import type { DynamicModule, INestApplicationContext, Provider, Type } from '@nestjs/common';
import { Module } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ScheduleModule } from '@nestjs/schedule';
import { SqlQueueModule, type SqlQueueModuleOptions } from '../../lib/src/index.js';
import { afterAll, afterEach } from 'vitest';
import { CaptureLogger } from './capture-logger.js';
import { dropPgSchema, PG_URL, uniqueSchema } from './databases.js';

export interface QueueAppOptions {
  schema: string;
  providers?: Provider[];
  /** Module options besides the connection and schema. */
  module?: Partial<SqlQueueModuleOptions>;
  /** Replaces SqlQueueModule.forRoot(...) entirely (for forRootAsync tests). */
  queueModule?: DynamicModule;
  imports?: (DynamicModule | Type)[];
  withSchedule?: boolean;
}

/** A real Nest application context on the local PostgreSQL, as a user would build it. */
export async function createQueueApp(
  options: QueueAppOptions,
): Promise<{ app: INestApplicationContext; logger: CaptureLogger }> {
  const logger = new CaptureLogger();
  const queueModule =
    options.queueModule ??
    SqlQueueModule.forRoot({
      connection: { dialect: 'postgres', url: PG_URL, poolSize: 6 },
      schema: options.schema,
      ...options.module,
    });
  @Module({
    imports: [
      ...(options.withSchedule === false ? [] : [ScheduleModule.forRoot()]),
      queueModule,
      ...(options.imports ?? []),
    ],
    providers: options.providers ?? [],
  })
  class TestAppModule {}
  const app = await NestFactory.createApplicationContext(TestAppModule, { logger, abortOnError: false });
  return { app, logger };
}

/**
 * A test file's own schema and the applications its tests boot there: each closed after its
 * test (even a failed one), the schema dropped after the file.
 */
export function queueAppSuite(prefix: string) {
  const schema = uniqueSchema(prefix);
  const apps: INestApplicationContext[] = [];
  afterEach(async () => {
    await Promise.all(apps.splice(0).map((app) => app.close().catch(() => undefined)));
  });
  afterAll(() => dropPgSchema(schema));
  return {
    schema,
    /** Boots an application in this schema; it is closed after the test. */
    async boot(options: Omit<QueueAppOptions, 'schema'> & { schema?: string } = {}) {
      const created = await createQueueApp({ schema, ...options });
      apps.push(created.app);
      return created;
    },
    /** For an application the test closes itself. */
    forget(app: INestApplicationContext): void {
      const index = apps.indexOf(app);
      if (index >= 0) apps.splice(index, 1);
    },
  };
}
