import { Inject, Injectable, type OnApplicationShutdown } from '@nestjs/common';
import { SQL_QUEUE_RUNTIME } from './sql-queue.tokens.js';
import type { SqlQueueRuntime } from './sql-queue.runtime.js';

/**
 * Closes connections last: Nest runs every beforeApplicationShutdown (consumer drain) before
 * any onApplicationShutdown. A pool passed in by the application stays open.
 */
@Injectable()
export class SqlQueueConnectionLifecycle implements OnApplicationShutdown {
  constructor(@Inject(SQL_QUEUE_RUNTIME) private readonly runtime: SqlQueueRuntime) {}

  async onApplicationShutdown(): Promise<void> {
    await this.runtime.close();
  }
}
