import { defineConfig } from 'vitest/config';

// Nest relies on legacy decorators and emitted design:paramtypes metadata for DI;
// oxc emits both when told to (the same setup @nestjs/schedule uses).
export default defineConfig({
  oxc: {
    decorator: { legacy: true, emitDecoratorMetadata: true },
  },
  test: {
    include: ['test/**/*.spec.ts'],
    globalSetup: ['test/helpers/global-setup.ts'],
    testTimeout: 60_000,
    hookTimeout: 60_000,
    pool: 'forks',
    sequence: { hooks: 'stack' },
  },
});
