import { fork, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { dropSchema, openStore, schemaName, type Result } from '../common.js';
import { serverCommits } from '../db-cost.js';

/**
 * What idle pods cost the database (issue 26): N worker processes (1, 4, 8: 50 are too many for
 * this machine) each consuming 20 idle queues with the defaults (pauses double from 50 ms to
 * maxPollMs 2 s, then one empty claim per queue per 2 s), and the transactions the database
 * commits meanwhile, from pg_stat_database (every statement of an idle consumer is one autocommit
 * claim). The figure for 50 pods follows from the formula the measurements check:
 * pods × queues ÷ maxPollMs.
 */
export async function idlePodsCase(url: string, seconds: number): Promise<Result[]> {
  const queues = 20;
  const maxPollMs = 2_000;
  const results: Result[] = [];
  for (const pods of [1, 4, 8]) {
    const schema = schemaName('idlepods');
    const store = await openStore(url, schema, 2);
    await store.close();
    const script = fileURLToPath(new URL('../idle-consumer.js', import.meta.url));
    const children: ChildProcess[] = [];
    try {
      for (let i = 0; i < pods; i++) {
        const child = fork(script, [JSON.stringify({ url, schema, queues, minPollMs: 50, maxPollMs })], {
          stdio: 'inherit',
        });
        children.push(child);
        child.send({ type: 'measure', seconds: 3_600 });
      }
      // Past the ramp of pauses (50 ms doubling to 2 s takes about 3 s) and past the backends'
      // idle flush of their statistics (10 s), so both readings lag alike.
      await new Promise((resolve) => setTimeout(resolve, 15_000));
      const before = await serverCommits(url);
      const started = Date.now();
      await new Promise((resolve) => setTimeout(resolve, seconds * 1_000));
      const after = await serverCommits(url);
      const perSecond = Math.round(((after - before) / ((Date.now() - started) / 1_000)) * 10) / 10;
      const formula = (pods * queues * 1_000) / maxPollMs;
      results.push({
        case: 'idle-pods',
        variant: `${pods} idle worker process(es) × ${queues} queues (defaults), database commits per second`,
        value: perSecond,
        unit: 'statements/s',
        reference: { name: `pods × queues ÷ maxPollMs (${formula}/s)`, value: formula },
      });
    } finally {
      for (const child of children) child.kill('SIGTERM');
      await Promise.all(children.map((child) => new Promise((resolve) => child.once('exit', resolve))));
      await dropSchema(url, schema);
    }
  }
  results.push({
    case: 'idle-pods',
    variant: `50 idle pods × ${queues} queues (the formula, not measured here)`,
    value: (50 * queues * 1_000) / maxPollMs,
    unit: 'statements/s',
  });
  return results;
}
