import { afterAll, expect, it } from 'vitest';
import type { QueueStore } from '../../lib/src/core/queue-store.js';
import { createPostgresStore } from '../../lib/src/store/postgres/postgres.connect.js';
import { PG_URL } from '../helpers/databases.js';
import { enqueueIds, groupDisagreements, groupJob, idsOf, owned } from '../helpers/groups.js';
import { migratedPgStore } from '../helpers/pg-store.js';

/**
 * Ordered groups, proof 2 (issue 11): many readers race for one group, round after round. The
 * group row is the mutex: exactly one claim of each round gets the group, and it gets the head
 * (the lower of two ready ids), never the job behind it.
 */
const pg = migratedPgStore('grprace', 2);
const CLAIMERS = 32;
const ROUNDS = 1_000;

const claimers: QueueStore[] = [];
afterAll(() => Promise.all(claimers.map((c) => c.close())));

it(`${CLAIMERS} claimers on their own connections, ${ROUNDS} rounds over a group with 2 ready jobs: each round exactly one claims, the lower id`, async () => {
  const { store, schema } = pg;
  const queue = 'race';
  for (let i = 0; i < CLAIMERS; i++) claimers.push(createPostgresStore({ url: PG_URL, poolSize: 1 }, { schema }));
  // Every connection open before the first round, so the claims of a round meet at the server.
  await Promise.all(claimers.map((c) => c.ping(10_000)));
  let ready = await enqueueIds(store, [groupJob(queue, 'g', { n: 0 }), groupJob(queue, 'g', { n: 1 })]);
  const wrong: string[] = [];
  for (let round = 0; round < ROUNDS && wrong.length === 0; round++) {
    const answers = await Promise.all(
      claimers.map((claimer, i) =>
        // Each asks for more than one unit: only the head may come back, whatever the limit.
        claimer.claim({ queue, limit: 2, groupBatchSize: 1, leaseMs: 60_000, workerId: `claimer-${i}` }),
      ),
    );
    const winners = answers.filter((a) => a.length > 0);
    if (winners.length !== 1 || idsOf(winners[0]!).join() !== ready[0]) {
      wrong.push(`round ${round}: ready ${ready.join(', ')}, claims got ${JSON.stringify(winners.map(idsOf))}`);
      break;
    }
    // The next round: the job behind the head, and a new one behind it.
    const [completed, [added]] = await Promise.all([
      store.complete(owned(winners[0]!)),
      enqueueIds(store, [groupJob(queue, 'g', { n: round + 2 })]),
    ]);
    expect(completed).toEqual([{ id: ready[0], outcome: 'ok' }]);
    ready = [ready[1]!, added!];
  }
  expect(wrong).toEqual([]);
  expect(await groupDisagreements(PG_URL, schema, { queue })).toEqual([]);
  expect(await store.stats(queue)).toMatchObject({ ready: 2, leased: 0 });
});
