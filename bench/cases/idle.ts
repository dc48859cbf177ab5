import { fork } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { bounded, dropSchema, openStore, schemaName, type Result } from '../common.js';

/**
 * An idle consumer process with 10 queues: its memory, and how many claim statements it
 * issues compared with the bound its poll settings allow.
 */
export async function idleCase(url: string, seconds: number): Promise<Result[]> {
  const schema = schemaName('idle');
  const store = await openStore(url, schema, 2);
  await store.close();
  const queues = 10;
  const minPollMs = 50;
  const maxPollMs = 2_000;
  const script = fileURLToPath(new URL('../idle-consumer.js', import.meta.url));
  const child = fork(script, [JSON.stringify({ url, schema, queues, minPollMs, maxPollMs })], { stdio: 'inherit' });
  let report!: (r: { rssBytes: number; claims: number; elapsedMs: number }) => void;
  const reported = new Promise<{ rssBytes: number; claims: number; elapsedMs: number }>(
    (resolve) => (report = resolve),
  );
  child.on('message', (m: { type: string; rssBytes: number; claims: number; elapsedMs: number }) => {
    if (m.type === 'report') report(m);
  });
  try {
    child.send({ type: 'measure', seconds });
    const r = await bounded('idle consumer', (seconds + 60) * 1000, reported);
    // Per queue: pauses double from min to max (ramp), then one claim per maxPollMs.
    let ramp = 0;
    let rampClaims = 0;
    for (let pause = minPollMs; pause < maxPollMs; pause *= 2) {
      ramp += pause;
      rampClaims++;
    }
    const bound = queues * (rampClaims + Math.ceil((r.elapsedMs - ramp) / maxPollMs) + 1);
    const rssMb = Math.round(r.rssBytes / 1024 / 1024);
    return [
      {
        case: 'idle',
        variant: `RSS, ${queues} idle queues`,
        value: rssMb,
        unit: 'MB',
        target: '< 100 MB',
        pass: rssMb < 100,
      },
      {
        case: 'idle',
        variant: `claim statements in ${Math.round(r.elapsedMs / 1000)} s, ${queues} queues`,
        value: r.claims,
        unit: 'claims',
        target: `<= ${bound} (maxPollMs ${maxPollMs})`,
        pass: r.claims <= bound,
      },
    ];
  } finally {
    child.kill('SIGTERM');
    await new Promise((resolve) => child.once('exit', resolve));
    await dropSchema(url, schema);
  }
}
