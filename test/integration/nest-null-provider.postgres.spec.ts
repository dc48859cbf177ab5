import { Injectable, Module } from '@nestjs/common';
import { afterAll, afterEach, expect, it } from 'vitest';
import { QueueHandler } from '../../lib/src/index.js';
import { dropPgSchema, uniqueSchema } from '../helpers/databases.js';
import { createQueueApp } from '../helpers/queue-app.js';

// Regression, found in review. Before the fix, the explorer (which walks every provider, not the
// decorator's index) asked DiscoveryService.getMetadataByDecorator about each one. For a value
// provider whose value is null or undefined, Nest gives instance = null and metatype = null, so
// Reflect.getMetadata(key, null) threw a TypeError and the application could not boot.

const schema = uniqueSchema('fr_nullp');
const apps: { close(): Promise<void> }[] = [];
afterEach(async () => {
  await Promise.all(apps.splice(0).map((app) => app.close().catch(() => undefined)));
});
afterAll(() => dropPgSchema(schema));

it('boots with an optional dependency provided as useValue: null', async () => {
  @QueueHandler('final.nullprovider')
  @Injectable()
  class Handler {
    async handle(): Promise<void> {}
  }
  @Module({ providers: [Handler, { provide: 'OPTIONAL_TRACER', useValue: null }] })
  class FeatureModule {}

  const { app } = await createQueueApp({ schema, imports: [FeatureModule] });
  apps.push(app);
  expect(app.get('OPTIONAL_TRACER', { strict: false })).toBeNull();
});
