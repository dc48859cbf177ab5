/**
 * A real Nest application consuming one queue with the OpenTelemetry SDK registered (as a
 * user's tracing setup would: an AsyncLocalStorage context manager, the W3C trace context
 * propagator), run as a child process by test/integration/tracing.postgres.spec.ts. Every span
 * this process ends is sent to the parent over IPC as { type: 'span', … } (the exporter below),
 * so the parent can check that its enqueue and this handler are one trace.
 *
 * A job's payload says how many of its attempts fail ({ failTimes }); each run reports
 * { type: 'handled', jobId, attempt, spanId } with the span active in the handler.
 */
import 'reflect-metadata';
import { Injectable, Logger, Module } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ScheduleModule } from '@nestjs/schedule';
import { trace } from '@opentelemetry/api';
import { ExportResultCode, type ExportResult } from '@opentelemetry/core';
import { type ReadableSpan, type SpanExporter } from '@opentelemetry/sdk-trace-base';
import { QueueHandler, SqlQueueModule, type JobContext, type QueueJobHandler } from '../../lib/src/index.js';
import { registerOtelSdk } from '../helpers/otel.js';
import type { WorkerConfig } from './nest-worker.js';
import { LineLogger, send, workerModuleOptions, workerQueueOptions } from './worker-ipc.js';

export interface TracingWorkerConfig extends WorkerConfig {
  consumerSpan?: 'child' | 'link';
}

/** A span as the parent receives it. */
export interface SpanMessage {
  type: 'span';
  name: string;
  kind: number;
  traceId: string;
  spanId: string;
  parentSpanId: string | null;
  attributes: Record<string, unknown>;
  status: { code: number; message?: string };
  events: { name: string; attributes: Record<string, unknown> }[];
  links: { traceId: string; spanId: string }[];
}

export function spanMessage(span: ReadableSpan): SpanMessage {
  return {
    type: 'span',
    name: span.name,
    kind: span.kind,
    traceId: span.spanContext().traceId,
    spanId: span.spanContext().spanId,
    parentSpanId: span.parentSpanContext?.spanId ?? null,
    attributes: { ...span.attributes },
    status: { ...span.status },
    events: span.events.map((event) => ({ name: event.name, attributes: { ...event.attributes } })),
    links: span.links.map((link) => ({ traceId: link.context.traceId, spanId: link.context.spanId })),
  };
}

const config = JSON.parse(process.argv[2] ?? '{}') as TracingWorkerConfig;

class IpcExporter implements SpanExporter {
  export(spans: ReadableSpan[], done: (result: ExportResult) => void): void {
    for (const span of spans) send({ ...spanMessage(span) });
    done({ code: ExportResultCode.SUCCESS });
  }
  shutdown(): Promise<void> {
    return Promise.resolve();
  }
}

registerOtelSdk(new IpcExporter());

@Injectable()
@QueueHandler(config.queue, { ...workerQueueOptions(config, 1), maxAttempts: 5 })
class TracedHandler implements QueueJobHandler<{ failTimes?: number }> {
  async handle(payload: { failTimes?: number }, job: JobContext): Promise<void> {
    await Promise.resolve();
    const spanId = trace.getActiveSpan()?.spanContext().spanId ?? null;
    send({ type: 'handled', jobId: job.jobId, attempt: job.attempt, spanId });
    if (job.attempt <= (payload.failTimes ?? 0)) throw new Error(`attempt ${job.attempt} fails on purpose`);
  }
}

@Module({
  imports: [
    ScheduleModule.forRoot(),
    SqlQueueModule.forRoot({
      ...workerModuleOptions(config),
      tracing: { consumerSpan: config.consumerSpan ?? 'child' },
    }),
  ],
  providers: [TracedHandler],
})
class WorkerModule {}

async function main(): Promise<void> {
  const app = await NestFactory.createApplicationContext(WorkerModule, { logger: new LineLogger() });
  send({ type: 'ready' });
  process.on('disconnect', () => process.exit(1));
  process.on('message', (message: { type?: string }) => {
    if (message?.type !== 'stop') return;
    void app.close().then(() => process.exit(0));
  });
}

main().catch((error: Error) => {
  new Logger('worker').error(error.stack ?? error.message);
  send({ type: 'failed', error: error.message });
  process.exit(1);
});
