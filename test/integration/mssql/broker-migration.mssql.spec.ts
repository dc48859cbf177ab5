/**
 * Schema version 11 (broker messages handled as table-queue jobs) on a SQL Server schema at
 * version 10 whose old Service Broker readers left dead messages in [BrokerDead], on both
 * databases. Migration 11 drops the old readers' attempt journal (BrokerAttempts) and moves every
 * BrokerDead row into Jobs as a dead job of its broker queue's table queue, in the payload a
 * receiver's move writes (broker.job.ts: type, conversationHandle, conversationGroupId, sequence,
 * the body in base64), in the ordered group of its conversation group, with its attempts and last
 * error (or 'dead: <reason>'); then drops BrokerDead. What the rest of the library assumes of the
 * result, checked here through the store and the broker's own decoding (brokerDeadMessage):
 * - listDead lists one dead job per row, in BrokerDead id order, grouped by conversation group;
 * - each body decodes per its queue's format: a JSON body written as send() writes it (UTF-16LE
 *   text, what `CAST(N'…' AS varbinary(max))` makes) to its value, an XML body to its text, raw
 *   bytes to a Buffer, no body to null;
 * - stats counts them, retryDead makes one runnable in its group, a claim returns it, and the
 *   repair sweep finds nothing to fix afterwards.
 */
import { randomUUID } from 'node:crypto';
import sql from 'mssql';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { encodeBrokerBody } from '../../../lib/src/broker/broker.body.js';
import { brokerDeadMessage, readBrokerJobPayload } from '../../../lib/src/broker/reader/broker.job.js';
import { resolveBrokerOptions } from '../../../lib/src/broker/broker.options.js';
import type { ResolvedBrokerQueue } from '../../../lib/src/broker/broker.types.js';
import type { JobRecord } from '../../../lib/src/core/types.js';
import { quoteMssqlIdentifier } from '../../../lib/src/store/mssql/mssql.identifiers.js';
import { createMssqlStore } from '../../../lib/src/store/mssql/mssql.connect.js';
import {
  MIGRATED_MAX_ATTEMPTS,
  MSSQL_LATEST_VERSION,
  mssqlReadVersion,
} from '../../../lib/src/store/mssql/mssql.migrations.js';
import { insertBrokerDeadRow, schemaVersions, TABLE_EXISTS } from '../../helpers/broker-test-queries.js';
import { uniqueSchema } from '../../helpers/databases.js';
import { dropMssqlSchema, mssqlRows, openMssqlPool, installMssqlSchemaUpTo } from '../../helpers/mssql.js';
import { groupDisagreements } from '../../helpers/mssql-test-queries.js';
import { describeEachMssqlDatabase } from './mssql-databases.js';

/** The last version before the broker's messages became jobs. */
const BEFORE = 10;
const WORKER = 'broker-migration-test';
const DEAD_AT = new Date('2026-01-02T03:04:05.678Z');

/** A BrokerDead row as an old reader wrote it. */
interface OldDead {
  queue: ResolvedBrokerQueue;
  handle: string;
  group: string;
  sequence: number;
  /** Sent as nvarchar, stored as its UTF-16LE bytes (CAST(@text AS varbinary(max))). */
  text?: string;
  body?: Buffer | null;
  attempts: number;
  crashes: number;
  lastError: string | null;
  reason: 'max-attempts' | 'crashes' | 'conversation-ended';
  /** What brokerDeadMessage must decode the body to, in the queue's format. */
  decoded: unknown;
}

describeEachMssqlDatabase(
  "upgrade to schema version 11: the old readers' dead messages become dead jobs that list, decode, retry and claim as a receiver's do",
  (db) => {
    const schema = uniqueSchema('brkmig');
    let pool: sql.ConnectionPool;
    // Three broker queues, one per body format (resolved without touching the database: only
    // names, message types and formats are needed here; no Service Broker object is created).
    const options = resolveBrokerOptions(
      { queues: { orders: {}, docs: { format: 'xml' }, blobs: { format: 'raw' } } },
      schema,
    )!;
    const queue = (name: string) => options.queues.find((q) => q.name === name)!;
    const orders = queue('orders');
    const docs = queue('docs');
    const blobs = queue('blobs');

    beforeAll(async () => {
      pool = await openMssqlPool(db.url, 2);
      // Version 10, as the previous release installed it (BrokerAttempts and BrokerDead from version 6).
      await installMssqlSchemaUpTo(pool, schema, BEFORE);
    });

    afterAll(async () => {
      await pool?.close();
      await dropMssqlSchema(db.url, schema);
    });

    async function tableExists(table: string): Promise<boolean> {
      const [row] = await mssqlRows<{ Exists: number }>(db.url, TABLE_EXISTS, (r) =>
        r.input('table', sql.NVarChar(300), `${quoteMssqlIdentifier(schema)}.${quoteMssqlIdentifier(table)}`),
      );
      return row?.Exists === 1;
    }

    async function insertOldDead(row: OldDead): Promise<string> {
      const [inserted] = (
        await pool
          .request()
          .input('queue', sql.NVarChar(128), row.queue.name)
          .input('handle', sql.UniqueIdentifier, row.handle)
          .input('group', sql.UniqueIdentifier, row.group)
          .input('sequence', sql.BigInt, row.sequence)
          .input('type', sql.NVarChar(256), row.queue.messageType)
          .input('text', sql.NVarChar(sql.MAX), row.text ?? null)
          .input('body', sql.VarBinary(sql.MAX), row.body ?? null)
          .input('attempts', sql.Int, row.attempts)
          .input('crashes', sql.Int, row.crashes)
          .input('lastError', sql.NVarChar(sql.MAX), row.lastError)
          .input('reason', sql.VarChar(32), row.reason)
          .input('deadAt', sql.DateTime2(3), DEAD_AT)
          .query<{ Id: string }>(insertBrokerDeadRow(schema))
      ).recordset;
      return inserted!.Id;
    }

    it('moves every BrokerDead row into a dead job of its queue (listed in id order, grouped by conversation group, decoded per format), drops both tables, and the jobs retry, claim and complete with nothing for the repair sweep', async () => {
      expect(await tableExists('BrokerAttempts'), 'version 10 has BrokerAttempts').toBe(true);
      expect(await tableExists('BrokerDead'), 'version 10 has BrokerDead').toBe(true);

      const shared = randomUUID(); // two messages of one conversation group
      const sharedHandle = randomUUID();
      const json = { n: 1, s: 'héllo ✓ "quoted"' };
      const xml = '<order id="7"><line sku="ä-1">two</line></order>';
      const raw = Buffer.from([0x00, 0xff, 0x10]);
      const rows: OldDead[] = [
        {
          queue: orders,
          handle: sharedHandle,
          group: shared,
          sequence: 1,
          text: JSON.stringify(json),
          attempts: 5,
          crashes: 0,
          lastError: 'handler failed: boom',
          reason: 'max-attempts',
          decoded: json,
        },
        {
          queue: docs,
          handle: randomUUID(),
          group: randomUUID(),
          sequence: 0,
          body: encodeBrokerBody('xml', xml, 1 << 20, 'broker migration test'),
          attempts: 3,
          crashes: 3,
          lastError: null,
          reason: 'crashes',
          decoded: xml,
        },
        {
          queue: orders,
          handle: sharedHandle,
          group: shared,
          sequence: 2,
          body: null,
          attempts: 0,
          crashes: 0,
          lastError: null,
          reason: 'conversation-ended',
          decoded: null,
        },
        {
          queue: blobs,
          handle: randomUUID(),
          group: randomUUID(),
          sequence: 4,
          body: raw,
          attempts: 2,
          crashes: 1,
          lastError: 'not a picture',
          reason: 'max-attempts',
          decoded: raw,
        },
      ];
      const oldIds: string[] = [];
      for (const row of rows) oldIds.push(await insertOldDead(row));

      const store = createMssqlStore({ pool }, { schema });
      try {
        expect(await store.migrate('auto')).toEqual({ current: MSSQL_LATEST_VERSION, latest: MSSQL_LATEST_VERSION });
        expect(await tableExists('BrokerAttempts'), 'BrokerAttempts dropped').toBe(false);
        expect(await tableExists('BrokerDead'), 'BrokerDead dropped').toBe(false);
        // The sender's tables stay.
        expect(await tableExists('BrokerDialogs')).toBe(true);
        expect(await tableExists('BrokerOutbox')).toBe(true);
        const [version] = await mssqlRows<{ Version: number }>(db.url, mssqlReadVersion(schema));
        expect(version?.Version).toBe(MSSQL_LATEST_VERSION);
        const versions = await mssqlRows<{ Version: number }>(db.url, schemaVersions(schema));
        expect(versions.map((v) => v.Version)).toEqual(Array.from({ length: MSSQL_LATEST_VERSION }, (_, i) => i + 1));

        // Each queue's dead jobs, in BrokerDead id order; and across queues the ids keep that order.
        const listed = new Map<string, JobRecord[]>();
        for (const q of [orders, docs, blobs]) listed.set(q.name, (await store.listDead(q.name, { limit: 100 })).jobs);
        const seen = JSON.stringify(Object.fromEntries(listed));
        const jobOf = new Map<OldDead, JobRecord>();
        for (const q of [orders, docs, blobs]) {
          const mine = rows.filter((r) => r.queue === q);
          const jobs = listed.get(q.name)!;
          expect(jobs, `one dead job per BrokerDead row of ${q.name}: ${seen}`).toHaveLength(mine.length);
          mine.forEach((row, i) => jobOf.set(row, jobs[i]!));
        }
        const idsInOldOrder = rows.map((row) => BigInt(jobOf.get(row)!.id));
        expect(
          idsInOldOrder.every((id, i) => i === 0 || id > idsInOldOrder[i - 1]!),
          `job ids follow BrokerDead ids ${oldIds.join(', ')}: ${seen}`,
        ).toBe(true);

        for (const row of rows) {
          const job = jobOf.get(row)!;
          const what = `BrokerDead row ${oldIds[rows.indexOf(row)]} (${row.queue.name}, ${row.reason}): ${seen}`;
          expect(job.state, what).toBe('dead');
          expect(job.queue, what).toBe(row.queue.name);
          // CONVERT(nvarchar(36), uniqueidentifier) is upper case, in the move as in the migration.
          expect(job.groupKey, what).toBe(row.group.toUpperCase());
          expect(job.attempts, what).toBe(row.attempts);
          expect(job.maxAttempts, what).toBe(Math.max(MIGRATED_MAX_ATTEMPTS, row.attempts));
          expect(job.lastError, what).toBe(row.lastError ?? `dead: ${row.reason}`);
          expect(job.finishedAt?.toISOString(), what).toBe(DEAD_AT.toISOString());
          // The payload a receiver writes, so the handler side reads it (it throws otherwise).
          const payload = readBrokerJobPayload(row.queue.name, job.id, job.payload);
          expect(payload, what).toMatchObject({
            type: row.queue.messageType,
            conversationHandle: row.handle.toUpperCase(),
            conversationGroupId: row.group.toUpperCase(),
            sequence: String(row.sequence),
          });
          expect(payload.droppedBytes, what).toBeUndefined();
          const dead = brokerDeadMessage(row.queue, job);
          expect(dead, what).toMatchObject({
            id: job.id,
            queue: row.queue.name,
            conversationHandle: row.handle.toUpperCase(),
            conversationGroupId: row.group.toUpperCase(),
            messageSequenceNumber: String(row.sequence),
            messageTypeName: row.queue.messageType,
            attempts: row.attempts,
            lastError: row.lastError ?? `dead: ${row.reason}`,
          });
          expect(dead.body, what).toEqual(row.decoded);
          if (Buffer.isBuffer(row.decoded)) expect(Buffer.isBuffer(dead.body), what).toBe(true);
        }
        for (const q of [orders, docs, blobs]) {
          expect((await store.stats(q.name)).dead, `${q.name}: ${seen}`).toBe(rows.filter((r) => r.queue === q).length);
        }

        // The first of the shared group runs again, in its group (the second stays dead behind it).
        const first = jobOf.get(rows[0]!)!;
        expect(await store.retryDead(orders.name, [first.id])).toEqual([first.id]);
        const claimed = await store.claim({
          queue: orders.name,
          limit: 10,
          groupBatchSize: 5,
          leaseMs: 60_000,
          workerId: WORKER,
        });
        expect(
          claimed.map((c) => ({ id: c.id, groupKey: c.groupKey, attempt: c.attempt })),
          JSON.stringify(claimed),
        ).toEqual([{ id: first.id, groupKey: shared.toUpperCase(), attempt: 1 }]);
        expect(claimed[0]!.payload).toEqual(first.payload);
        expect(await store.complete([{ id: first.id, claimToken: claimed[0]!.claimToken }])).toEqual([
          { id: first.id, outcome: 'ok' },
        ]);
        expect(await store.stats(orders.name)).toMatchObject({ ready: 0, leased: 0, dead: 1, blockedGroups: 0 });
        for (const q of [orders, docs, blobs]) {
          expect(
            await mssqlRows(db.url, groupDisagreements(schema), (r) => r.input('queue', sql.NVarChar(128), q.name)),
            q.name,
          ).toEqual([]);
        }
        expect(await store.repairGroups(1_000)).toEqual([]);
      } finally {
        await store.close();
      }
    });
  },
);
