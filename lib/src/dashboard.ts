// Entry point 'nestjs-sql-queue/dashboard': the web dashboard (page, assets and JSON API),
// served by the application's own HTTP server. Kept apart from the main entry point so that
// applications without it load none of it.
export { SqlQueueDashboardModule } from './dashboard/dashboard.module.js';
export { SQL_QUEUE_DASHBOARD_OPTIONS } from './dashboard/dashboard.options.js';
export type { SqlQueueDashboardOptions } from './dashboard/dashboard.options.js';
export type { DashboardJobDetail, DashboardOverview, DashboardThroughput } from './dashboard/dashboard.service.js';
