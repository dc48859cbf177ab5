/**
 * Actual plans of the store's own statements: each is captured as the store sends it (text and
 * bound parameters, through a pool the store shares), then run again on a connection with
 * SET STATISTICS XML ON, which returns each statement's actual plan as one more result set.
 */
import sql from 'mssql';
import { expect } from 'vitest';
import type { QueueStore } from '../../../lib/src/core/queue-store.js';
import { STATISTICS_XML_OFF, STATISTICS_XML_ON } from '../../helpers/mssql-test-queries.js';
import { parseXml, statementPlans, type StatementPlan, type XmlElement } from '../../helpers/showplan.js';

/** A statement as the store sent it: its text and its bound parameters (mssql's own records). */
export interface SentStatement {
  text: string;
  parameters: sql.Request['parameters'];
}

/**
 * Wraps `pool.request()` so that, while `capture` runs some work, every statement sent through
 * the pool is recorded. The store runs each statement as `pool.request()…query(text)`.
 */
export function statementRecorder(pool: sql.ConnectionPool) {
  let recording: SentStatement[] | null = null;
  const request = pool.request.bind(pool);
  pool.request = () => {
    const created = request();
    const query = created.query.bind(created);
    created.query = ((text: string) => {
      recording?.push({ text, parameters: { ...created.parameters } });
      return query(text);
    }) as unknown as typeof created.query;
    return created;
  };
  return async function capture(work: () => Promise<unknown>): Promise<SentStatement[]> {
    recording = [];
    try {
      await work();
      return recording;
    } finally {
      recording = null;
    }
  };
}

/** Every showplan document among a result's record sets, read into statement plans. */
export function plansOf(recordsets: sql.IRecordSet<Record<string, unknown>>[]): StatementPlan[] {
  const plans: StatementPlan[] = [];
  for (const recordset of recordsets) {
    const column = Object.keys(recordset.columns ?? {}).find((name) => /showplan/i.test(name));
    if (column) for (const row of recordset) plans.push(...statementPlans(String(row[column])));
  }
  return plans;
}

/**
 * Runs `work`, which must send one statement, then runs that statement again with the same
 * parameters on `planPool` with actual showplans on, and returns its recordsets.
 */
export async function replayWithShowplans(
  capture: ReturnType<typeof statementRecorder>,
  planPool: sql.ConnectionPool,
  work: () => Promise<unknown>,
): Promise<sql.IRecordSet<Record<string, unknown>>[]> {
  const sent = await capture(work);
  expect(sent, 'the store sends one statement for this call').toHaveLength(1);
  // Per session: set again each time, in case the pool replaced its one connection.
  await planPool.request().batch(STATISTICS_XML_ON);
  const replay = planPool.request();
  Object.assign(replay.parameters, sent[0]!.parameters);
  const result = await replay.query(sent[0]!.text);
  return result.recordsets as sql.IRecordSet<Record<string, unknown>>[];
}

/**
 * Rows each index of `schema`.`table` was read for (ActualRowsRead: before any residual
 * predicate), summed over every seek or scan of the showplans in `recordsets`.
 */
export function rowsReadByIndex(
  recordsets: sql.IRecordSet<Record<string, unknown>>[],
  schema: string,
  table: string,
): Map<string, number> {
  const read = new Map<string, number>();
  const visit = (element: XmlElement) => {
    if (element.name === 'RelOp' && /Seek|Scan/.test(element.attributes.PhysicalOp ?? '')) {
      const scan = element.children.find((c) => c.name === 'IndexScan');
      const object = scan?.children.find((c) => c.name === 'Object');
      if (object?.attributes.Schema === `[${schema}]` && object.attributes.Table === `[${table}]`) {
        const index = (object.attributes.Index ?? '(heap)').replace(/^\[(.*)\]$/, '$1');
        const counters =
          element.children
            .find((c) => c.name === 'RunTimeInformation')
            ?.children.filter((c) => c.name === 'RunTimeCountersPerThread') ?? [];
        const rows = counters.reduce(
          (sum, c) => sum + Number(c.attributes.ActualRowsRead ?? c.attributes.ActualRows ?? 0),
          0,
        );
        read.set(index, (read.get(index) ?? 0) + rows);
      }
    }
    element.children.forEach(visit);
  };
  for (const recordset of recordsets) {
    const column = Object.keys(recordset.columns ?? {}).find((name) => /showplan/i.test(name));
    if (column) for (const row of recordset) visit(parseXml(String(row[column])));
  }
  return read;
}

/** The pools and store a plan test opens; any may be missing when its setup failed. */
export interface PlanTestPools {
  planPool?: sql.ConnectionPool;
  store?: QueueStore;
  pool?: sql.ConnectionPool;
}

/** Closes what a plan test opened, showplans switched off first on the replay pool's session. */
export async function closePlanPools(opened: PlanTestPools): Promise<void> {
  await opened.planPool
    ?.request()
    .batch(STATISTICS_XML_OFF)
    .catch(() => undefined);
  await opened.planPool?.close();
  await opened.store?.close();
  await opened.pool?.close();
}
