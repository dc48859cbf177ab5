import {
  Body,
  Controller,
  ForbiddenException,
  Get,
  HttpCode,
  Inject,
  NotFoundException,
  Param,
  Post,
  Query,
  Req,
  Res,
  type Type,
  UseFilters,
  UseGuards,
  UseInterceptors,
} from '@nestjs/common';
import { HttpAdapterHost } from '@nestjs/core';
import { DashboardAssets } from './dashboard.assets.js';
import { csrfCookie, csrfProblem, csrfTokenOf, newCsrfToken } from './dashboard.csrf.js';
import {
  DashboardExceptionFilter,
  DashboardHeadersInterceptor,
  type DashboardRequest,
  setHeaders,
} from './dashboard.http.js';
import type { ResolvedDashboardOptions } from './dashboard.options.js';
import { SqlQueueDashboardService } from './dashboard.service.js';

/** A path usable in `<base href>` and a cookie's Path: printable ASCII without ';'. */
const COOKIE_SAFE_PATH = /^\/[\x21-\x3a\x3c-\x7e]*$/;

/**
 * The dashboard's routes, relative to its mount path. forRoot() mounts a subclass of its own
 * (createDashboardController), so the path and guard can be options.
 */
export class DashboardControllerBase {
  constructor(
    @Inject(SqlQueueDashboardService) private readonly service: SqlQueueDashboardService,
    @Inject(DashboardAssets) private readonly assets: DashboardAssets,
    @Inject(HttpAdapterHost) private readonly adapterHost: HttpAdapterHost,
  ) {}

  /**
   * The page, with the mount path as the browser sees it (global prefix included) for its
   * relative URLs, and a CSRF token in its markup and in a cookie scoped to that path.
   */
  @Get()
  page(@Req() request: DashboardRequest, @Res({ passthrough: true }) response: unknown): string {
    const { readOnly, refreshMs, path } = this.service.options;
    const url = this.adapterHost.httpAdapter.getRequestUrl(request) as string;
    const seen = url.split('?')[0]!.replace(/\/?$/, '/');
    const baseHref = COOKIE_SAFE_PATH.test(seen) ? seen : `${path}/`;
    // An open tab keeps working when another tab reloads the page.
    const csrfToken = csrfTokenOf(request.headers) ?? newCsrfToken();
    setHeaders(this.adapterHost, response, {
      'Content-Type': 'text/html; charset=utf-8',
      'Set-Cookie': csrfCookie(csrfToken, baseHref),
    });
    return this.assets.page({ baseHref, csrfToken, readOnly, refreshMs });
  }

  /**
   * `<path>/` on Fastify, whose router (unlike Express's) tells it from `<path>` unless the
   * application sets ignoreTrailingSlash: routed as `<path>/*` there (see routeTrailingSlash),
   * and anything below the mount path that no other route takes is a 404.
   */
  pageUnderMount(
    @Param('*') rest: string | undefined,
    @Req() request: DashboardRequest,
    @Res({ passthrough: true }) response: unknown,
  ): string {
    if (rest) throw new NotFoundException(`the dashboard has no page '${rest.slice(0, 100)}'`);
    return this.page(request, response);
  }

  @Get('assets/:file')
  asset(@Param('file') file: string, @Res({ passthrough: true }) response: unknown): string {
    const asset = this.assets.asset(file);
    if (!asset) throw new NotFoundException(`the dashboard has no asset '${String(file).slice(0, 100)}'`);
    // Revalidated on every load: a new package version is picked up at once.
    setHeaders(this.adapterHost, response, { 'Content-Type': asset.contentType, 'Cache-Control': 'no-cache' });
    return asset.body;
  }

  @Get('api/overview')
  overview() {
    return this.service.overview();
  }

  @Get('api/throughput')
  throughput(@Query('minutes') minutes: unknown) {
    return this.service.throughput(minutes);
  }

  @Get('api/queues/:queue/jobs')
  jobs(
    @Param('queue') queue: string,
    @Query('state') state: unknown,
    @Query('limit') limit: unknown,
    @Query('cursor') cursor: unknown,
  ) {
    return this.service.listJobs(queue, { state, limit, cursor });
  }

  @Get('api/jobs/:id')
  job(@Param('id') id: string) {
    return this.service.job(id);
  }

  @Get('api/queues/:queue/groups')
  groups(@Param('queue') queue: string, @Query('after') after: unknown, @Query('limit') limit: unknown) {
    return this.service.blockedGroups(queue, { after, limit });
  }

  @Get('api/queues/:queue/flow')
  flow(@Param('queue') queue: string, @Query('limit') limit: unknown) {
    return this.service.flow(queue, { limit });
  }

  @Get('api/schedules')
  schedules() {
    return this.service.schedules();
  }

  @Post('api/queues/:queue/dead/retry')
  @HttpCode(200)
  retryDead(@Req() request: DashboardRequest, @Param('queue') queue: string, @Body() body: unknown) {
    this.allowAction(request);
    return this.service.retryDead(queue, body);
  }

  @Post('api/queues/:queue/dead/purge')
  @HttpCode(200)
  purgeDead(@Req() request: DashboardRequest, @Param('queue') queue: string, @Body() body: unknown) {
    this.allowAction(request);
    return this.service.purgeDead(queue, body);
  }

  @Post('api/jobs/:id/cancel')
  @HttpCode(200)
  cancelJob(@Req() request: DashboardRequest, @Param('id') id: string) {
    this.allowAction(request);
    return this.service.cancelJob(id);
  }

  @Post('api/queues/:queue/pause')
  @HttpCode(200)
  pauseQueue(@Req() request: DashboardRequest, @Param('queue') queue: string, @Body() body: unknown) {
    this.allowAction(request);
    return this.service.pauseQueue(queue, body);
  }

  @Post('api/queues/:queue/resume')
  @HttpCode(200)
  resumeQueue(@Req() request: DashboardRequest, @Param('queue') queue: string) {
    this.allowAction(request);
    return this.service.resumeQueue(queue);
  }

  @Post('api/schedules/:id/pause')
  @HttpCode(200)
  pauseSchedule(@Req() request: DashboardRequest, @Param('id') id: string) {
    this.allowAction(request);
    return this.service.pauseSchedule(id);
  }

  @Post('api/schedules/:id/resume')
  @HttpCode(200)
  resumeSchedule(@Req() request: DashboardRequest, @Param('id') id: string) {
    this.allowAction(request);
    return this.service.resumeSchedule(id);
  }

  @Post('api/schedules/:id/trigger')
  @HttpCode(200)
  triggerSchedule(@Req() request: DashboardRequest, @Param('id') id: string) {
    this.allowAction(request);
    return this.service.triggerSchedule(id);
  }

  /** Every action is refused when read-only, and without the page's CSRF token from this origin. */
  private allowAction(request: DashboardRequest): void {
    if (this.service.options.readOnly) throw new ForbiddenException('the dashboard is read-only');
    const problem = csrfProblem(request.headers);
    if (problem) throw new ForbiddenException(problem);
  }
}

/** The controller of one forRoot(): its mount path, its guard (none for 'none'), the dashboard's headers and errors. */
export function createDashboardController(options: ResolvedDashboardOptions): Type<DashboardControllerBase> {
  class SqlQueueDashboardController extends DashboardControllerBase {
    // Its own function, so that the route routeTrailingSlash may give it belongs to this mount only.
    override pageUnderMount(rest: string | undefined, request: DashboardRequest, response: unknown): string {
      return super.pageUnderMount(rest, request, response);
    }
  }
  Controller(options.path)(SqlQueueDashboardController);
  UseInterceptors(DashboardHeadersInterceptor)(SqlQueueDashboardController);
  UseFilters(DashboardExceptionFilter)(SqlQueueDashboardController);
  if (options.guard !== 'none') UseGuards(options.guard)(SqlQueueDashboardController);
  return SqlQueueDashboardController;
}

/**
 * Routes `<path>/*` to pageUnderMount on Fastify (not elsewhere: Express serves `<path>/` as
 * `<path>` already). Called once the HTTP adapter is known and before the routes are
 * registered: from the module's configure().
 */
export function routeTrailingSlash(controller: Type<DashboardControllerBase>, adapter: string | undefined): void {
  if (adapter !== 'fastify') return;
  const descriptor = Object.getOwnPropertyDescriptor(controller.prototype, 'pageUnderMount')!;
  Get('*')(controller.prototype, 'pageUnderMount', descriptor);
}
