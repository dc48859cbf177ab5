import type { DynamicModule, INestApplicationContext, Provider, Type } from '@nestjs/common';
import { Module } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ScheduleModule } from '@nestjs/schedule';
import { SqlQueueModule, type SqlQueueModuleOptions } from '../../lib/src/index.js';
import { CaptureLogger } from './capture-logger.js';
import { PG_URL } from './databases.js';

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
