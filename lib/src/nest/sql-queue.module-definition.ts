import { ConfigurableModuleBuilder } from '@nestjs/common';
import type { SqlQueueModuleOptions } from './sql-queue.options.js';

/**
 * forRoot / forRootAsync (useFactory, useClass, useExisting) and the isGlobal extra come from
 * Nest's builder rather than hand-written provider plumbing.
 *
 * Global unless `isGlobal: false`: an application has exactly one SqlQueueModule (a second is
 * refused at boot), so feature modules inject QueueProducer without importing it; importing it
 * again would only create that refused second instance.
 */
export const {
  ConfigurableModuleClass: SqlQueueConfigurableModule,
  MODULE_OPTIONS_TOKEN: SQL_QUEUE_MODULE_OPTIONS,
  OPTIONS_TYPE: SQL_QUEUE_OPTIONS_TYPE,
  ASYNC_OPTIONS_TYPE: SQL_QUEUE_ASYNC_OPTIONS_TYPE,
} = new ConfigurableModuleBuilder<SqlQueueModuleOptions>({ moduleName: 'SqlQueue' })
  .setClassMethodName('forRoot')
  .setFactoryMethodName('createSqlQueueOptions')
  .setExtras({ isGlobal: true }, (definition, extras) => ({ ...definition, global: extras.isGlobal !== false }))
  .build();
