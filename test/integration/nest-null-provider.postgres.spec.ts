import { Injectable, Module } from '@nestjs/common';
import { expect, it } from 'vitest';
import { QueueHandler } from '../../lib/src/index.js';
import { queueAppSuite } from '../helpers/queue-app.js';

// Regression, found in review. Before the fix, the explorer (which walks every provider, not the
// decorator's index) asked DiscoveryService.getMetadataByDecorator about each one. For a value
// provider whose value is null or undefined, Nest gives instance = null and metatype = null, so
// Reflect.getMetadata(key, null) threw a TypeError and the application could not boot.

const { boot } = queueAppSuite('nullp');

it('boots with an optional dependency provided as useValue: null', async () => {
  @QueueHandler('final.nullprovider')
  @Injectable()
  class Handler {
    async handle(): Promise<void> {}
  }
  @Module({ providers: [Handler, { provide: 'OPTIONAL_TRACER', useValue: null }] })
  class FeatureModule {}

  const { app } = await boot({ imports: [FeatureModule] });
  expect(app.get('OPTIONAL_TRACER', { strict: false })).toBeNull();
});
