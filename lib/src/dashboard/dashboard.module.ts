import {
  type DynamicModule,
  Inject,
  type MiddlewareConsumer,
  Module,
  type NestModule,
  Optional,
  type Type,
} from '@nestjs/common';
import { HttpAdapterHost } from '@nestjs/core';
import { SqlQueueConfigError } from '../core/errors.js';
import { DashboardAssets } from './dashboard.assets.js';
import { createDashboardController, type DashboardControllerBase, routeTrailingSlash } from './dashboard.controller.js';
import {
  resolveDashboardOptions,
  SQL_QUEUE_DASHBOARD_OPTIONS,
  type SqlQueueDashboardOptions,
} from './dashboard.options.js';
import { SqlQueueDashboardService } from './dashboard.service.js';

/** The controller class forRoot() made for this mount. */
const DASHBOARD_CONTROLLER = Symbol('SQL_QUEUE_DASHBOARD_CONTROLLER');

/**
 * A web dashboard of the queue, served by the application's own HTTP server (Express or
 * Fastify) from files inside the package: `SqlQueueDashboardModule.forRoot({ guard })` next to
 * `SqlQueueModule.forRoot()`. The page and its JSON API live under `path` (default '/queues',
 * below the global prefix if any), all behind `guard`; every action is a POST checked against
 * a CSRF token, and `readOnly: true` refuses them all.
 */
@Module({})
export class SqlQueueDashboardModule implements NestModule {
  constructor(
    @Optional() @Inject(DASHBOARD_CONTROLLER) private readonly controller: Type<DashboardControllerBase> | undefined,
    @Inject(HttpAdapterHost) private readonly adapterHost: HttpAdapterHost,
  ) {
    if (!controller) {
      throw new SqlQueueConfigError(
        "SqlQueueDashboardModule is imported without options: import SqlQueueDashboardModule.forRoot({ guard: YourAuthGuard }) (or guard: 'none')",
      );
    }
  }

  /** Checks the options at once (a bad one fails the boot) and mounts a controller of its own at `path`. */
  static forRoot(options: SqlQueueDashboardOptions): DynamicModule {
    const resolved = resolveDashboardOptions(options);
    const controller = createDashboardController(resolved);
    return {
      module: SqlQueueDashboardModule,
      imports: resolved.imports,
      controllers: [controller],
      providers: [
        { provide: SQL_QUEUE_DASHBOARD_OPTIONS, useValue: resolved },
        { provide: DASHBOARD_CONTROLLER, useValue: controller },
        // Read once, at boot: a missing file fails the boot rather than the first page view.
        { provide: DashboardAssets, useFactory: () => DashboardAssets.load() },
        SqlQueueDashboardService,
      ],
    };
  }

  /** No middleware: the one moment the HTTP adapter is known and routes are not registered yet. */
  configure(_consumer: MiddlewareConsumer): void {
    routeTrailingSlash(this.controller!, this.adapterHost.httpAdapter?.getType());
  }
}
