import { Controller, Get, Param } from '@nestjs/common';
import { QueueProducer, SqlQueueMetrics, type QueueStats, type SqlQueueProcessFigures } from 'nestjs-sql-queue';

/** A queue's figures: the database's (all workers) and this process's. */
export interface QueueStatsResponse {
  queue: string;
  /** Read now from the database, for every worker. */
  stats: QueueStats;
  /** From the cached all-queue reading (null when it failed): the attempt history's figures. */
  recent: {
    failureWindowMs: number;
    recentFailures: number;
    recentLeaseExpiries: number;
    repeatedlyFailing: number;
  } | null;
  /** What this process did: completions, failures, lost ownership, latencies, its readers. */
  process: SqlQueueProcessFigures;
}

@Controller('queues')
export class QueuesController {
  constructor(
    private readonly producer: QueueProducer,
    private readonly metrics: SqlQueueMetrics,
  ) {}

  @Get(':name/stats')
  async stats(@Param('name') name: string): Promise<QueueStatsResponse> {
    // stats() validates the name first (400 through the error filter).
    const [stats, figures] = await Promise.all([this.producer.stats(name), this.metrics.queue(name)]);
    return {
      queue: stats.queue,
      stats,
      recent: figures.database
        ? {
            failureWindowMs: this.metrics.options.failureWindowMs,
            recentFailures: figures.database.recentFailures,
            recentLeaseExpiries: figures.database.recentLeaseExpiries,
            repeatedlyFailing: figures.database.repeatedlyFailing,
          }
        : null,
      process: figures.process,
    };
  }
}
