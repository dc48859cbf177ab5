import { fileURLToPath } from 'node:url';
import { defineConfig } from 'vitest/config';

// Nest relies on legacy decorators and emitted design:paramtypes metadata for DI;
// oxc emits both when told to (the same setup @nestjs/schedule uses).
export default defineConfig({
  // The sample app imports the package by name, as a user would; tests run it from source.
  resolve: {
    alias: [
      {
        find: /^nestjs-sql-queue\/health$/,
        replacement: fileURLToPath(new URL('./lib/src/health.ts', import.meta.url)),
      },
      {
        find: /^nestjs-sql-queue\/dashboard$/,
        replacement: fileURLToPath(new URL('./lib/src/dashboard.ts', import.meta.url)),
      },
      {
        find: /^nestjs-sql-queue\/prometheus$/,
        replacement: fileURLToPath(new URL('./lib/src/prometheus.ts', import.meta.url)),
      },
      { find: /^nestjs-sql-queue$/, replacement: fileURLToPath(new URL('./lib/src/index.ts', import.meta.url)) },
    ],
  },
  oxc: {
    decorator: { legacy: true, emitDecoratorMetadata: true },
  },
  test: {
    include: ['test/**/*.spec.ts'],
    globalSetup: ['test/helpers/global-setup.ts'],
    testTimeout: 60_000,
    hookTimeout: 60_000,
    pool: 'forks',
    // Two files at a time on 2 cores (Vitest's default there is one): most integration files wait
    // on databases, timers and child processes rather than on the CPU.
    maxWorkers: 2,
    sequence: { hooks: 'stack' },
  },
});
