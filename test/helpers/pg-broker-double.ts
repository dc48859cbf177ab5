/**
 * Service Broker's side of the receivers, on PostgreSQL, for tests of what the broker queues
 * share with the table queue (no SQL Server runs here): a BrokerDriver whose receiver
 * connections answer the receiver's two statements (waitForMessages, moveMessages) against
 * tables that play the Service Broker queue, so that the real receiver, the real activation
 * pool, the real table-queue consumer and the real broker job handler run on top of it, in one
 * process or in several (every bit of state is in the database).
 *
 * What it keeps of Service Broker: messages of one conversation in sequence order; a
 * conversation group locked by one move at a time (a row lock, skip-locked, as RECEIVE skips
 * groups other transactions hold); a move is one transaction that receives and enqueues, or
 * does neither; EndDialog and Error end the conversation in the move and become no job;
 * DialogTimer is dropped. The payload of a moved message is built by brokerJobPayload, the
 * JS twin of moveMessages' FOR JSON expression (lib/src/broker/reader/broker.receiver.queries.ts).
 */
import { randomUUID } from 'node:crypto';
import pg from 'pg';
import type { BrokerJobPayload } from '../../lib/src/broker/reader/broker.job.js';
import { BROKER_SYSTEM } from '../../lib/src/broker/broker.names.js';
import {
  BROKER_MOVE_ROUNDS,
  moveMessages,
  waitForMessages,
} from '../../lib/src/broker/reader/broker.receiver.queries.js';
import type {
  BrokerConnection,
  BrokerDriver,
  BrokerParams,
  BrokerRow,
  BrokerSession,
  ResolvedBrokerQueue,
} from '../../lib/src/broker/broker.types.js';
import type { QueueStore } from '../../lib/src/core/queue-store.js';
import type { NewJob } from '../../lib/src/core/types.js';
import { DEFAULT_MAX_PAYLOAD_BYTES } from '../../lib/src/core/validation.js';

/** One message as Service Broker would hold it. */
export interface BrokerMessageDouble {
  type: string;
  handle: string;
  group: string;
  sequence: bigint;
  body: Buffer | null;
}

/**
 * The payload moveMessages writes for a message of `queue` (see its FOR JSON expression): the
 * body as UTF-16LE text for format 'json' when it looks like UTF-16LE text, else its bytes in
 * base64; a body too large to move as its size only.
 */
export function brokerJobPayload(
  queue: ResolvedBrokerQueue,
  message: BrokerMessageDouble,
  maxBodyBytes = DEFAULT_MAX_PAYLOAD_BYTES,
): BrokerJobPayload {
  const payload: BrokerJobPayload = {
    type: message.type,
    conversationHandle: message.handle,
    conversationGroupId: message.group,
    sequence: String(message.sequence),
  };
  const body = message.body;
  if (body === null) return payload;
  if (body.length > maxBodyBytes) return { ...payload, droppedBytes: body.length };
  const looksUtf16 = body.length > 0 && body.length % 2 === 0 && body[0] !== 0 && body[1] === 0;
  if (queue.format === 'json' && looksUtf16) return { ...payload, text: body.toString('utf16le') };
  return { ...payload, body: body.toString('base64') };
}

/** The rejection of a wait that cancel() stopped (what isCancelled() recognizes). */
class CancelledError extends Error {
  readonly code = 'ECANCEL';
}

const ENDING = new Set<string>([BROKER_SYSTEM.END_DIALOG, BROKER_SYSTEM.ERROR]);
const DROPPED = BROKER_SYSTEM.DIALOG_TIMER;

export interface PgBrokerDoubleOptions {
  url: string;
  /** The test's schema: the store's tables and the double's own (sb_*) live there. */
  schema: string;
  /** The store the moves enqueue with (in the move's transaction). */
  store: QueueStore;
  queues: readonly ResolvedBrokerQueue[];
  /** How often an idle wait looks for work (default 20 ms). */
  pollMs?: number;
  /** The moves' maxPayloadBytes (default the module default's). */
  maxBodyBytes?: number;
}

export class PgBrokerDouble implements BrokerDriver {
  private readonly pool: pg.Pool;
  private readonly s: string;
  private readonly statements = new Map<string, { kind: 'wait' | 'move'; queue: ResolvedBrokerQueue }>();
  private readonly open = new Set<PgBrokerConnection>();
  /** Test hook: runs inside each move's transaction after its RECEIVEs, before it enqueues. */
  beforeEnqueue: ((moved: number) => Promise<void> | void) | null = null;

  get maxBodyBytes(): number {
    return this.options.maxBodyBytes ?? DEFAULT_MAX_PAYLOAD_BYTES;
  }

  constructor(readonly options: PgBrokerDoubleOptions) {
    this.pool = new pg.Pool({ connectionString: options.url, max: 20 });
    this.pool.on('error', () => undefined);
    this.s = `"${options.schema}"`;
    for (const queue of options.queues) {
      this.statements.set(waitForMessages(queue.queue), { kind: 'wait', queue });
      this.statements.set(moveMessages(options.schema, queue, this.maxBodyBytes), { kind: 'move', queue });
    }
  }

  /** Creates the double's tables (idempotent). */
  async install(): Promise<void> {
    await this.pool.query(`
CREATE TABLE IF NOT EXISTS ${this.s}.sb_groups (queue text NOT NULL, group_id uuid PRIMARY KEY);
CREATE TABLE IF NOT EXISTS ${this.s}.sb_messages (
  id bigserial PRIMARY KEY, queue text NOT NULL, group_id uuid NOT NULL REFERENCES ${this.s}.sb_groups,
  handle uuid NOT NULL, sequence bigint NOT NULL, type text NOT NULL, body bytea);
CREATE TABLE IF NOT EXISTS ${this.s}.sb_sequences (handle uuid PRIMARY KEY, queue text NOT NULL, last bigint NOT NULL);
CREATE TABLE IF NOT EXISTS ${this.s}.sb_ended (handle uuid NOT NULL, by_move boolean NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp());`);
  }

  /**
   * A new conversation of broker queue `queue` in a group of its own (the default on the target
   * side: one group per dialog); ids in the upper case SQL Server's CONVERT gives.
   */
  conversation(queue: string): { queue: string; handle: string; group: string } {
    return { queue, handle: randomUUID().toUpperCase(), group: randomUUID().toUpperCase() };
  }

  /**
   * Sends `body` on the conversation (the next sequence number of it, or `sequence`: a message
   * the broker raises itself, such as an Error, need not come last); returns its sequence.
   */
  async send(
    conversation: { queue: string; handle: string; group: string },
    body: Buffer | null,
    type?: string,
    sequence?: bigint,
  ): Promise<bigint> {
    const queue = this.queueNamed(conversation.queue);
    const client = await this.pool.connect();
    try {
      await client.query('BEGIN');
      await client.query(
        `INSERT INTO ${this.s}.sb_groups (queue, group_id) VALUES ($1, $2) ON CONFLICT (group_id) DO NOTHING`,
        [queue.name, conversation.group],
      );
      const { rows } = await client.query<{ last: string }>(
        `INSERT INTO ${this.s}.sb_sequences (handle, queue, last) VALUES ($1, $2, 1)
         ON CONFLICT (handle) DO UPDATE SET last = sb_sequences.last + 1 RETURNING last::text`,
        [conversation.handle, queue.name],
      );
      const at = sequence ?? BigInt(rows[0]!.last);
      await client.query(
        `INSERT INTO ${this.s}.sb_messages (queue, group_id, handle, sequence, type, body) VALUES ($1, $2, $3, $4, $5, $6)`,
        [queue.name, conversation.group, conversation.handle, String(at), type ?? queue.messageType, body],
      );
      await client.query('COMMIT');
      return at;
    } catch (error) {
      await client.query('ROLLBACK').catch(() => undefined);
      throw error;
    } finally {
      client.release();
    }
  }

  /** Messages still waiting in the double's queue `queue`. */
  async waiting(queue: string): Promise<number> {
    const { rows } = await this.pool.query<{ n: string }>(
      `SELECT count(*)::text AS n FROM ${this.s}.sb_messages WHERE queue = $1`,
      [queue],
    );
    return Number(rows[0]!.n);
  }

  /** Conversations of broker queue `queue` ended on our side: by a move (EndDialog, Error) or by a Close job. */
  async ended(queue: string): Promise<{ handle: string; byMove: boolean; at: Date }[]> {
    const { rows } = await this.pool.query<{ handle: string; by_move: boolean; at: Date }>(
      `SELECT upper(e.handle::text) AS handle, e.by_move, e.at FROM ${this.s}.sb_ended AS e
       JOIN ${this.s}.sb_sequences AS c ON c.handle = e.handle WHERE c.queue = $1 ORDER BY e.at`,
      [queue],
    );
    return rows.map((row) => ({ handle: row.handle, byMove: row.by_move, at: row.at }));
  }

  /** What the runtime's Close job does: END CONVERSATION in autocommit (what is left of it in the queue is deleted, as on the server). */
  async endConversation(handle: string): Promise<void> {
    await this.pool.query(
      `WITH gone AS (DELETE FROM ${this.s}.sb_messages WHERE handle = $1)
       INSERT INTO ${this.s}.sb_ended (handle, by_move) VALUES ($1, false)`,
      [handle],
    );
  }

  // ---- BrokerDriver

  async openConnection(): Promise<BrokerConnection> {
    const connection = new PgBrokerConnection(this, await this.pool.connect());
    this.open.add(connection);
    return connection;
  }

  beginReader(): Promise<BrokerSession> {
    return Promise.reject(new Error('PgBrokerDouble: reader transactions are not modelled (pass createListener)'));
  }

  begin(): Promise<BrokerSession> {
    return Promise.reject(new Error('PgBrokerDouble: sends are not modelled; use send()'));
  }

  query<R extends BrokerRow = BrokerRow>(text: string): Promise<R[]> {
    return Promise.reject(new Error(`PgBrokerDouble: no shared-pool statements are modelled: ${text.slice(0, 80)}`));
  }

  errorNumber(): number | undefined {
    return undefined;
  }

  isCancelled(error: unknown): boolean {
    return error instanceof CancelledError;
  }

  async close(): Promise<void> {
    await Promise.all([...this.open].map((connection) => connection.close()));
    await this.pool.end();
  }

  // ---- the two statements, as a receiver's connection runs them

  /** @internal */
  statement(text: string): { kind: 'wait' | 'move'; queue: ResolvedBrokerQueue } {
    const found = this.statements.get(text);
    if (!found) throw new Error(`PgBrokerDouble: not a receiver statement of a declared queue: ${text.slice(0, 80)}`);
    return found;
  }

  /** @internal autocommit: locks a lockable group with messages for the statement only. */
  async hasWork(client: pg.PoolClient, queue: ResolvedBrokerQueue): Promise<boolean> {
    const { rows } = await client.query(
      `SELECT 1 FROM ${this.s}.sb_groups AS g
       WHERE g.queue = $1 AND EXISTS (SELECT 1 FROM ${this.s}.sb_messages AS m WHERE m.group_id = g.group_id)
       FOR NO KEY UPDATE SKIP LOCKED LIMIT 1`,
      [queue.name],
    );
    return rows.length > 0;
  }

  /** @internal one move: RECEIVE (delete) and enqueue in one transaction. */
  async move(client: pg.PoolClient, queue: ResolvedBrokerQueue, maxAttempts: number): Promise<BrokerRow[]> {
    const top = queue.messagesPerTransaction;
    await client.query('BEGIN');
    try {
      const received: BrokerMessageDouble[] = [];
      for (let round = 0; round < BROKER_MOVE_ROUNDS && received.length < top; round++) {
        // The next group no other move holds (this move's own locks do not conflict with it).
        const { rows: groups } = await client.query<{ group_id: string }>(
          `SELECT upper(g.group_id::text) AS group_id FROM ${this.s}.sb_groups AS g
           WHERE g.queue = $1 AND EXISTS (SELECT 1 FROM ${this.s}.sb_messages AS m WHERE m.group_id = g.group_id)
           ORDER BY (SELECT min(m.id) FROM ${this.s}.sb_messages AS m WHERE m.group_id = g.group_id)
           FOR NO KEY UPDATE SKIP LOCKED LIMIT 1`,
          [queue.name],
        );
        if (groups.length === 0) break;
        const { rows } = await client.query<{
          handle: string;
          group_id: string;
          sequence: string;
          type: string;
          body: Buffer | null;
        }>(
          `DELETE FROM ${this.s}.sb_messages WHERE id IN (
             SELECT id FROM ${this.s}.sb_messages WHERE group_id = $1 ORDER BY handle, sequence LIMIT $2)
           RETURNING upper(handle::text) AS handle, upper(group_id::text) AS group_id, sequence::text, type, body`,
          [groups[0]!.group_id, top - received.length],
        );
        if (rows.length === 0) break;
        received.push(
          ...rows.map((row) => ({
            type: row.type,
            handle: row.handle,
            group: row.group_id,
            sequence: BigInt(row.sequence),
            body: row.body,
          })),
        );
      }
      // END CONVERSATION deletes what is left of the conversation in the queue, so the move
      // receives it first (as moveMessages does): an Error need not be its conversation's last.
      const ending = [...new Set(received.filter((m) => ENDING.has(m.type)).map((m) => m.handle))].sort();
      for (const handle of ending) {
        const { rows } = await client.query<{ group_id: string; sequence: string; type: string; body: Buffer | null }>(
          `DELETE FROM ${this.s}.sb_messages WHERE handle = $1
           RETURNING upper(group_id::text) AS group_id, sequence::text, type, body`,
          [handle],
        );
        for (const row of rows) {
          received.push({
            type: row.type,
            handle,
            group: row.group_id,
            sequence: BigInt(row.sequence),
            body: row.body,
          });
        }
      }
      const ordered = [...received].sort((a, b) =>
        a.group !== b.group
          ? a.group < b.group
            ? -1
            : 1
          : a.handle !== b.handle
            ? a.handle < b.handle
              ? -1
              : 1
            : a.sequence < b.sequence
              ? -1
              : a.sequence > b.sequence
                ? 1
                : 0,
      );
      const jobs: NewJob[] = ordered
        .filter((m) => !ENDING.has(m.type) && m.type !== DROPPED)
        .map((m) => ({
          queue: queue.name,
          payload: JSON.stringify(brokerJobPayload(queue, m, this.maxBodyBytes)),
          priority: 0,
          runAt: null,
          delayMs: 0,
          groupKey: m.group,
          concurrencyKey: null,
          idempotencyKey: null,
          maxAttempts: null,
          defaultMaxAttempts: maxAttempts,
        }));
      await this.beforeEnqueue?.(jobs.length);
      if (jobs.length > 0) await this.options.store.enqueue(jobs, client);
      const ended = ending;
      for (const handle of ended) {
        await client.query(`INSERT INTO ${this.s}.sb_ended (handle, by_move) VALUES ($1, true)`, [handle]);
      }
      await client.query('COMMIT');
      return [{ Received: received.length, Moved: jobs.length, Ended: ended.length, Errors: null }];
    } catch (error) {
      await client.query('ROLLBACK').catch(() => undefined);
      throw error;
    }
  }

  /** @internal */
  forget(connection: PgBrokerConnection): void {
    this.open.delete(connection);
  }

  private queueNamed(name: string): ResolvedBrokerQueue {
    const queue = this.options.queues.find((q) => q.name === name);
    if (!queue) throw new Error(`PgBrokerDouble: no broker queue '${name}'`);
    return queue;
  }
}

/** A receiver's connection: one pg client, one statement at a time. */
class PgBrokerConnection implements BrokerConnection {
  private cancelWait: (() => void) | null = null;
  private closed = false;

  constructor(
    private readonly double: PgBrokerDouble,
    private readonly client: pg.PoolClient,
  ) {}

  async query<R extends BrokerRow = BrokerRow>(text: string, params: BrokerParams = {}): Promise<R[]> {
    if (this.closed) throw new Error('PgBrokerDouble: connection closed');
    const { kind, queue } = this.double.statement(text);
    if (kind === 'move') return (await this.double.move(this.client, queue, Number(params.maxAttempts?.value))) as R[];
    const deadline = Date.now() + Number(params.timeoutMs?.value);
    let cancelled = false;
    const stop = new Promise<void>((resolve) => (this.cancelWait = () => ((cancelled = true), resolve())));
    try {
      for (;;) {
        if (cancelled) throw new CancelledError('Canceled.');
        if (await this.double.hasWork(this.client, queue)) return [{ Ready: 1 }] as unknown as R[];
        const left = deadline - Date.now();
        if (left <= 0) return [{ Ready: 0 }] as unknown as R[];
        await Promise.race([
          stop,
          new Promise((resolve) => setTimeout(resolve, Math.min(left, this.double.options.pollMs ?? 20))),
        ]);
      }
    } finally {
      this.cancelWait = null;
    }
  }

  cancel(): void {
    this.cancelWait?.();
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.double.forget(this);
    this.client.release();
  }
}
