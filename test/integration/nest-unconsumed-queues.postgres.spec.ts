import { expect, it } from 'vitest';
import { QueueHandler } from '../../lib/src/index.js';
import { queueAppSuite } from '../helpers/queue-app.js';

// Issue 9 (friction in a fresh app). Before the fix, a @QueueHandler class missing from every
// module's providers was silently never consumed, even with its queue in `queues`: the
// "configured but no handler" warning fired only when at least one other handler existed, and
// nothing said which queues the process did consume.

const { boot } = queueAppSuite('unconsumed');

// Decorated, and listed in no module's providers: the mistake this file is about.
@QueueHandler('boot.forgotten')
class ForgottenHandler {
  async handle() {}
}

it('logs each consumed queue with its effective options, and warns for a configured queue nobody consumes', async () => {
  @QueueHandler('boot.provided', { maxReaders: 3, maxAttempts: 4 })
  class ProvidedHandler {
    async handle() {}
  }
  const { logger } = await boot({
    providers: [ProvidedHandler],
    module: {
      queues: { 'boot.forgotten': { maxAttempts: 2 }, 'boot.elsewhere': {}, 'boot.provided': { leaseMs: 5_000 } },
    },
  });

  const [consuming] = logger.matching(/^consuming queue 'boot\.provided'/);
  expect(consuming).toMatch(/ as worker \S+: minReaders=1, maxReaders=3, /);
  expect(consuming).toMatch(
    /, leaseMs=5000, maxDurationMs=3600000, maxAttempts=4, minPollMs=50, maxPollMs=2000, groupOnDead=continue, groupBatchSize=1, limits=none, transactional=false$/,
  );
  const warnings = logger.lines.filter((line) => line.level === 'warn').map((line) => line.message);
  expect(warnings).toContain(
    `queue 'boot.forgotten' is configured in queues but this process does not consume it: ${ForgottenHandler.name} has @QueueHandler('boot.forgotten') but is in no module's providers`,
  );
  expect(warnings).toContain(
    "queue 'boot.elsewhere' is configured in queues but this process does not consume it: no provider has @QueueHandler('boot.elsewhere') (fine if another process consumes it)",
  );
  expect(warnings.filter((w) => w.includes('boot.provided'))).toEqual([]);
});

it('warns when no handler at all is provided, naming the forgotten class', async () => {
  const { logger } = await boot({ module: { queues: { 'boot.forgotten': {} } } });
  const warnings = logger.lines.filter((line) => line.level === 'warn').map((line) => line.message);
  expect(warnings).toContainEqual(
    expect.stringMatching(
      /^no @QueueHandler provider in this application, so this process consumes no queue: list handler classes in a module's providers, or set consumer\.enabled: false in a producer-only process \(.*ForgottenHandler has @QueueHandler\('boot\.forgotten'\).* in no module's providers\)$/,
    ),
  );
  expect(warnings).toContainEqual(
    expect.stringMatching(/^queue 'boot\.forgotten' is configured in queues but this process/),
  );
  expect(logger.matching(/^consuming queue/)).toEqual([]);
});

it('says nothing of the kind in a producer-only process', async () => {
  const { logger } = await boot({ module: { consumer: { enabled: false }, queues: { 'boot.forgotten': {} } } });
  expect(logger.lines.filter((line) => line.level === 'warn')).toEqual([]);
});
