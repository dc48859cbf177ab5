import { expect, it } from 'vitest';
import { prepareJob } from '../../lib/src/core/producer/job-validation.js';
import { migratedPgStore } from '../helpers/pg-store.js';

// Regression, found in review. Before the fix, the uniform bulk statement took one jsonb document,
// and its 64M-character guard assumed jsonb is at most ~3 bytes per character of JSON text, but jsonb's binary form can be
// much larger than the text: every array element costs a 4-byte JEntry plus an int-aligned
// numeric, so `1,` (2 characters) takes ~12 bytes. One jsonb document is capped at 256 MB
// (JENTRY_OFFLENMASK), so a uniform batch of about 45M characters of small numbers now fails with
// "total size of jsonb array elements exceeds the maximum", where the jsonb[] form (one datum
// per payload, each far under the cap) inserted it.

const LIMITS = { maxPayloadBytes: 1024 * 1024, defaultMaxAttempts: 3 };
const db = migratedPgStore('fr_jsz', 1);

it('enqueues a uniform batch of 1,000 payloads of 24k small integers (48M characters)', async () => {
  const numbers = new Array<number>(24_000).fill(1);
  const jobs = Array.from({ length: 1_000 }, () => prepareJob('final.jsonb', numbers, {}, LIMITS));
  const chars = jobs.reduce((sum, job) => sum + job.payload.length, 0);
  expect(chars).toBeLessThan(64 * 1024 * 1024); // under the guard: the uniform statement takes it
  const results = await db.store.enqueue(jobs);
  expect(results).toHaveLength(1_000);
}, 120_000);
