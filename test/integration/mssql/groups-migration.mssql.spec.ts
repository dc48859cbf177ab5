/**
 * Schema version 5 (ordered groups) on a SQL Server schema at version 4 with grouped jobs in
 * flight (issue 11: "upgrades under migrations: 'auto' without losing or reordering any of
 * them"), on both databases. Version 4 kept group keys but ignored them, so a group could have
 * a job running (leased by an instance of the old version) and jobs waiting, in any state.
 * The migration builds one row per group with unfinished jobs: headed by its lowest unfinished
 * job and held by the token of its lowest leased one; the jobs then run on, in id order.
 */
import { randomUUID } from 'node:crypto';
import sql from 'mssql';
import { afterAll, beforeAll, expect, it } from 'vitest';
import type { ClaimedJob } from '../../../lib/src/core/types.js';
import { createMssqlStore } from '../../../lib/src/store/mssql/mssql.connect.js';
import { MSSQL_LATEST_VERSION } from '../../../lib/src/store/mssql/mssql.migrations.js';
import { uniqueSchema } from '../../helpers/databases.js';
import { dropMssqlSchema, mssqlRows, openMssqlPool, installMssqlSchemaUpTo } from '../../helpers/mssql.js';
import { groupDisagreements, groupRow, insertPreGroupsJob } from '../../helpers/mssql-test-queries.js';
import { describeEachMssqlDatabase } from './mssql-databases.js';

const QUEUE = 'upgrade';
const HOUR = 3_600_000;
const WORKER = 'upgrade-test';

describeEachMssqlDatabase('upgrade to schema version 5 with grouped jobs in flight', (db) => {
  const schema = uniqueSchema('grpmig');
  let pool: sql.ConnectionPool;

  beforeAll(async () => {
    pool = await openMssqlPool(db.url, 2);
    // Version 4, as the previous release installed it.
    await installMssqlSchemaUpTo(pool, schema, 4);
  });

  afterAll(async () => {
    await pool?.close();
    await dropMssqlSchema(db.url, schema);
  });

  /** A job row as version 4 wrote it; returns its id. */
  async function oldJob(groupKey: string | null, state: string, runInMs = -1_000, token: string | null = null) {
    const [row] = (
      await pool
        .request()
        .input('queue', sql.NVarChar(128), QUEUE)
        .input('groupKey', sql.NVarChar(255), groupKey)
        .input('state', sql.VarChar(8), state)
        .input('runInMs', sql.Int, runInMs)
        .input('token', sql.UniqueIdentifier, token)
        .query<{ Id: string }>(insertPreGroupsJob(schema))
    ).recordset;
    return row!.Id;
  }

  async function rowOf(groupKey: string) {
    const [row] = await mssqlRows<{ HeadId: string; HeldToken: string | null; Blocked: number; Waiting: number }>(
      db.url,
      groupRow(schema),
      (r) => r.input('queue', sql.NVarChar(128), QUEUE).input('groupKey', sql.NVarChar(255), groupKey),
    );
    return row ?? null;
  }

  it('heads each group by its lowest unfinished job, held by its lowest leased token; the jobs run on in id order', async () => {
    const oldToken = randomUUID();
    const otherToken = randomUUID();
    // a: a finished job, one running (old version), two waiting.
    await oldJob('a', 'done');
    const a1 = await oldJob('a', 'leased', -1_000, oldToken);
    const a2 = await oldJob('a', 'ready');
    const a3 = await oldJob('a', 'ready');
    // b: its first job waits for a retry an hour away; the one behind it must not overtake it.
    const b1 = await oldJob('b', 'delayed', HOUR);
    await oldJob('b', 'ready');
    // c: the old version ran a later job first; the group stays held until it finishes.
    const c1 = await oldJob('c', 'ready');
    const c2 = await oldJob('c', 'leased', -1_000, otherToken);
    // d: nothing unfinished, so no row.
    await oldJob('d', 'done');
    const loose = await oldJob(null, 'ready');

    const store = createMssqlStore({ pool }, { schema });
    // Up to the latest version: 5, and those after it.
    expect(await store.migrate('auto')).toEqual({ current: MSSQL_LATEST_VERSION, latest: MSSQL_LATEST_VERSION });

    expect(await rowOf('a')).toMatchObject({ HeadId: a1, HeldToken: oldToken, Blocked: 0, Waiting: 0 });
    // A head an hour away waits outside the claimable index.
    expect(await rowOf('b')).toMatchObject({ HeadId: b1, HeldToken: null, Blocked: 0, Waiting: 1 });
    expect(await rowOf('c')).toMatchObject({ HeadId: c1, HeldToken: otherToken, Blocked: 0, Waiting: 0 });
    expect(await rowOf('d')).toBeNull();
    expect(
      await mssqlRows(db.url, groupDisagreements(schema), (r) => r.input('queue', sql.NVarChar(128), QUEUE)),
    ).toEqual([]);

    const claim = () => store.claim({ queue: QUEUE, limit: 10, groupBatchSize: 1, leaseMs: 60_000, workerId: WORKER });
    const owned = (jobs: ClaimedJob[]) => jobs.map(({ id, claimToken }) => ({ id, claimToken }));
    // Held groups and a head not due: only the ungrouped job.
    const first = await claim();
    expect(first.map((c) => c.id)).toEqual([loose]);
    await store.complete(owned(first));
    // The jobs the old version leased finish with their tokens, and release their groups.
    expect(await store.complete([{ id: a1, claimToken: oldToken }])).toEqual([{ id: a1, outcome: 'ok' }]);
    expect(await store.complete([{ id: c2, claimToken: otherToken }])).toEqual([{ id: c2, outcome: 'ok' }]);
    const next = await claim();
    expect(next.map((c) => c.id).sort()).toEqual([a2, c1].sort());
    await store.complete(owned(next));
    expect((await claim()).map((c) => c.id)).toEqual([a3]);
    expect(await store.stats(QUEUE)).toMatchObject({ delayed: 1, ready: 1, leased: 1 });
    await store.close();
  });
});
