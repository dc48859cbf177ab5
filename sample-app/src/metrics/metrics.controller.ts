import { Controller, Get, Res } from '@nestjs/common';
import { SqlQueuePrometheusExporter } from 'nestjs-sql-queue/prometheus';

/** Prometheus scrape endpoint: the queue's metrics in the text exposition format. */
@Controller('metrics')
export class MetricsController {
  constructor(private readonly exporter: SqlQueuePrometheusExporter) {}

  @Get()
  async metrics(@Res({ passthrough: true }) response: { setHeader(name: string, value: string): unknown }) {
    response.setHeader('Content-Type', this.exporter.contentType);
    return this.exporter.metrics();
  }
}
