import { Injectable, Module } from '@nestjs/common';
import { describe, expect, it } from 'vitest';
import { QueueProducer, SqlQueueConfigError, SqlQueueMetrics, SqlQueueModule } from '../../lib/src/index.js';
import { SqlQueueHealthIndicator, SqlQueueHealthModule } from '../../lib/src/health.js';
import { SqlQueuePrometheusExporter, SqlQueuePrometheusModule } from '../../lib/src/prometheus.js';
import { PG_URL } from '../helpers/databases.js';
import { queueAppSuite } from '../helpers/queue-app.js';

// Issue 9 (friction in a fresh app). Before the fix, QueueProducer could be injected in a
// feature module only with `isGlobal: true`, which the quick start did not show; and importing
// the bare SqlQueueModule class in a feature module failed with Nest's "can't resolve
// dependencies of the Symbol(SQL_QUEUE_RUNTIME) (?)", which does not say what to do.

const { schema, boot } = queueAppSuite('global');
const connection = { dialect: 'postgres' as const, url: PG_URL, poolSize: 4 };

@Injectable()
class OrdersService {
  constructor(
    readonly producer: QueueProducer,
    readonly metrics: SqlQueueMetrics,
  ) {}
}
@Module({ providers: [OrdersService], exports: [OrdersService] })
class OrdersModule {}

describe('SqlQueueModule is global by default', () => {
  it('feature modules inject QueueProducer without importing it; health and Prometheus still find it', async () => {
    @Module({
      imports: [SqlQueueHealthModule, SqlQueuePrometheusModule.forRoot({})],
      exports: [SqlQueueHealthModule, SqlQueuePrometheusModule],
    })
    class OpsModule {}
    // forRoot() as the quick start writes it: no isGlobal.
    const { app } = await boot({
      queueModule: SqlQueueModule.forRoot({ connection, schema }),
      imports: [OrdersModule, OpsModule],
    });

    const orders = app.get(OrdersService);
    expect(orders.producer).toBeInstanceOf(QueueProducer);
    expect(orders.metrics).toBeInstanceOf(SqlQueueMetrics);
    expect((await orders.producer.enqueue('global.q', {})).created).toBe(true);
    const health = app.get(SqlQueueHealthIndicator);
    expect(await health.database('queue_database')).toMatchObject({ queue_database: { status: 'up' } });
    expect(await app.get(SqlQueuePrometheusExporter).metrics()).toMatch(
      /^sqlqueue_jobs\{queue="global\.q",state="ready"\} 1$/m,
    );
  });

  it('forRootAsync is global by default too', async () => {
    const { app } = await boot({
      queueModule: SqlQueueModule.forRootAsync({ useFactory: () => ({ connection, schema }) }),
      imports: [OrdersModule],
    });
    expect(app.get(OrdersService).producer).toBeInstanceOf(QueueProducer);
  });

  it('isGlobal: false keeps it local: then one shared module re-exports it', async () => {
    await expect(
      boot({ queueModule: SqlQueueModule.forRoot({ connection, schema, isGlobal: false }), imports: [OrdersModule] }),
    ).rejects.toThrow(/OrdersService/);

    const shared = SqlQueueModule.forRoot({ connection, schema, isGlobal: false });
    @Module({ imports: [shared], exports: [shared] })
    class QueueModule {}
    @Module({ imports: [QueueModule], providers: [OrdersService] })
    class OrdersWithQueueModule {}
    const { app } = await boot({ queueModule: QueueModule as never, imports: [OrdersWithQueueModule] });
    expect(app.get(OrdersService, { strict: false }).producer).toBeInstanceOf(QueueProducer);
  });
});

describe('the bare SqlQueueModule class', () => {
  it('is refused with a message naming forRoot() and forRootAsync()', async () => {
    @Module({ imports: [SqlQueueModule], providers: [OrdersService] })
    class FeatureImportingTheClass {}

    // Next to a forRoot() in the application module: the usual mistake.
    const refused = boot({ imports: [FeatureImportingTheClass] });
    await expect(refused).rejects.toThrow(SqlQueueConfigError);
    await expect(refused).rejects.toThrow(
      /SqlQueueModule is imported without forRoot\(\): import SqlQueueModule\.forRoot\(\{ connection, … \}\) or SqlQueueModule\.forRootAsync\(\{ … \}\) once/,
    );

    // Alone: the same message.
    await expect(boot({ queueModule: FeatureImportingTheClass as never })).rejects.toThrow(
      /imported without forRoot\(\)/,
    );
  });
});
