import { SqlQueueConfigError } from '../core/errors.js';
import type { QueueLogger } from '../core/logger.js';
import { NO_TRACING, type QueueTracer } from '../core/tracing.js';
import type { OtelTracerOptions } from './otel.tracer.js';

export interface TracingSettings {
  enabled: boolean;
  consumerSpan: 'child' | 'link';
  claimSpans: boolean;
  reaperSpans: boolean;
}

/**
 * The tracer a module runs with, chosen at boot: OpenTelemetry's when tracing is on and the
 * optional peer `@opentelemetry/api` is installed, else NO_TRACING. The implementation (and with
 * it the API) is loaded with import() here only, so an application without the package boots
 * and runs as before. `load` is for tests (a stand-in for the import).
 */
export async function loadQueueTracer(
  settings: TracingSettings,
  clientId: string,
  logger: Pick<QueueLogger, 'debug'>,
  load: () => Promise<{ OtelQueueTracer: new (options: OtelTracerOptions) => QueueTracer }> = () =>
    import('./otel.tracer.js'),
): Promise<QueueTracer> {
  if (!settings.enabled) return NO_TRACING;
  let loaded: Awaited<ReturnType<typeof load>>;
  try {
    loaded = await load();
  } catch (error) {
    if (!isMissingApi(error)) {
      throw new SqlQueueConfigError(
        `tracing: loading the OpenTelemetry tracer failed (${error instanceof Error ? error.message : String(error)}): reinstall @opentelemetry/api (a broken or partial install?), or set tracing.enabled: false to run without tracing`,
        { cause: error },
      );
    }
    logger.debug?.('tracing: @opentelemetry/api is not installed, so jobs carry no trace context');
    return NO_TRACING;
  }
  const { consumerSpan, claimSpans, reaperSpans } = settings;
  return new loaded.OtelQueueTracer({ consumerSpan, claimSpans, reaperSpans, clientId });
}

/** The optional peer is absent (and not some other module the tracer needs). */
function isMissingApi(error: unknown): boolean {
  const { code, message } = (error ?? {}) as { code?: unknown; message?: unknown };
  return (
    (code === 'ERR_MODULE_NOT_FOUND' || code === 'MODULE_NOT_FOUND') &&
    typeof message === 'string' &&
    message.includes("'@opentelemetry/api'")
  );
}
