import { context, propagation, trace } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { W3CTraceContextPropagator } from '@opentelemetry/core';
import { BasicTracerProvider, SimpleSpanProcessor, type SpanExporter } from '@opentelemetry/sdk-trace-base';

/**
 * Registers an OpenTelemetry SDK globally as an application would (the Node SDK's defaults: an
 * async-hooks context manager and the W3C propagator), exporting every span to `exporter` as it
 * ends. Tests and worker processes use this one setup.
 */
export function registerOtelSdk<E extends SpanExporter>(exporter: E): E {
  trace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }));
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  propagation.setGlobalPropagator(new W3CTraceContextPropagator());
  return exporter;
}

/** Removes what registerOtelSdk set, so the next test starts without an SDK. */
export function unregisterOtelSdk(): void {
  trace.disable();
  context.disable();
  propagation.disable();
}
