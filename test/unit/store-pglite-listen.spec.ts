import { PGlite } from '@electric-sql/pglite';
import { afterEach, expect, it } from 'vitest';
import { createPostgresStore } from '../../lib/src/store/postgres/postgres.connect.js';
import { deferred } from '../helpers/wait-for.js';

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function wakeArrives(schema: string): Promise<string> {
  const db = await PGlite.create();
  const store = createPostgresStore({ pglite: db, ownsDb: true }, { schema });
  cleanups.push(() => store.close());
  await store.migrate('auto');
  const woke = deferred<string>();
  const unlisten = await store.listen((queue) => woke.resolve(queue));
  cleanups.push(unlisten);
  await store.notify('q');
  return Promise.race([woke.promise, new Promise<string>((r) => setTimeout(() => r('no wake-up'), 2_000))]);
}

it('pglite: a lower-case schema gets its wake-up (control)', async () => {
  await expect(wakeArrives('queue_lower')).resolves.toBe('q');
});

it('pglite: a mixed-case schema (valid name) gets its wake-up', async () => {
  await expect(wakeArrives('Queue_Mixed')).resolves.toBe('q');
});
