import net from 'node:net';
import { WireProxy } from './tcp-proxy.js';
import { deferred } from './wait-for.js';

/**
 * A TCP proxy between one worker process and PostgreSQL that the test controls. It reads the
 * frontend/backend protocol as it passes (message type + length framing, nothing more), so a
 * drill can:
 * - count the statements a process sends, by prepared-statement name and first parameter
 *   (the queue name of a claim), from the wire rather than from the library's own counters;
 * - let one statement reach the server and withhold the server's reply from the worker, then
 *   cut the connection: "the completion commits but the reply never arrives".
 *
 * Plain TCP only: node-postgres asks for TLS only when configured to, and the tests do not.
 */

const SSL_REQUEST = 80877103;
const GSSENC_REQUEST = 80877104;

/** One statement execution seen on the wire (a Bind, or a simple Query). */
export interface StatementRecord {
  at: number;
  connection: number;
  /** Prepared-statement name ('' for unnamed statements and simple queries). */
  name: string;
  /** Statement text when the proxy saw it parsed on this connection (or the simple query). */
  text: string | null;
  /** First bound parameter as text, or null (binary, absent or NULL). */
  firstParam: string | null;
}

/** A connection whose replies are being withheld, after a chosen statement was sent. */
export interface HeldReply {
  connection: number;
  statement: StatementRecord;
  /** Resolves when the server finished the statement (sent ReadyForQuery): it has committed. */
  serverDone: Promise<void>;
  /** Closes both sides: the worker sees its connection drop and never gets the reply. */
  cut(): void;
}

interface Interceptor {
  match: (statement: StatementRecord) => boolean;
  resolve: (held: HeldReply) => void;
}

/** Splits a byte stream into protocol messages; `untyped` counts leading startup-style messages. */
class MessageReader {
  private buffer: Buffer = Buffer.alloc(0);

  constructor(
    private untyped: number,
    private readonly onMessage: (type: string, body: Buffer) => void,
    private readonly onUntyped: (code: number) => void = () => undefined,
  ) {}

  push(chunk: Buffer): void {
    this.buffer = this.buffer.length === 0 ? chunk : Buffer.concat([this.buffer, chunk]);
    for (;;) {
      if (this.untyped > 0) {
        if (this.buffer.length < 8) return;
        const length = this.buffer.readInt32BE(0);
        if (this.buffer.length < length) return;
        const code = this.buffer.readInt32BE(4);
        this.buffer = this.buffer.subarray(length);
        this.untyped--;
        // A TLS or GSS request is followed by the real startup message.
        if (code === SSL_REQUEST || code === GSSENC_REQUEST) this.untyped++;
        this.onUntyped(code);
        continue;
      }
      if (this.buffer.length < 5) return;
      const length = this.buffer.readInt32BE(1);
      if (this.buffer.length < 1 + length) return;
      const type = String.fromCharCode(this.buffer[0]!);
      const body = this.buffer.subarray(5, 1 + length);
      this.buffer = this.buffer.subarray(1 + length);
      this.onMessage(type, body);
    }
  }
}

function cstring(body: Buffer, offset: number): [string, number] {
  const end = body.indexOf(0, offset);
  return [body.toString('utf8', offset, end), end + 1];
}

function firstTextParam(body: Buffer, offset: number): string | null {
  const formats = body.readInt16BE(offset);
  const firstFormat = formats === 0 ? 0 : body.readInt16BE(offset + 2);
  offset += 2 + 2 * formats;
  const params = body.readInt16BE(offset);
  offset += 2;
  if (params === 0 || firstFormat !== 0) return null;
  const length = body.readInt32BE(offset);
  return length < 0 ? null : body.toString('utf8', offset + 4, offset + 4 + length);
}

export class PgProxy extends WireProxy {
  readonly statements: StatementRecord[] = [];
  /** When each client connection was accepted (reconnect storms show here). */
  readonly connectionsOpened: number[] = [];
  private readonly interceptors: Interceptor[] = [];
  private nextConnection = 1;

  /** Listens on a free local port and forwards to the server named in `url`. */
  static start(url: string): Promise<PgProxy> {
    const parsed = new URL(url);
    return WireProxy.listen(
      (server) => new PgProxy(server, { host: parsed.hostname, port: Number(parsed.port || 5432) }),
    );
  }

  /** Executions of statements whose name ends with `suffix` (e.g. '_claim'), optionally in a window. */
  count(suffix: string, from = 0, to = Infinity, firstParam?: string): number {
    return this.statements.filter(
      (s) =>
        s.name.endsWith(suffix) &&
        s.at >= from &&
        s.at < to &&
        (firstParam === undefined || s.firstParam === firstParam),
    ).length;
  }

  /**
   * The next connection on which a statement matching `match` is executed: that statement
   * still reaches the server, but nothing the server sends afterwards reaches the client.
   */
  holdReplyAfter(match: (statement: StatementRecord) => boolean): Promise<HeldReply> {
    const held = deferred<HeldReply>();
    this.interceptors.push({ match, resolve: held.resolve });
    return held.promise;
  }

  protected relay(client: net.Socket, upstream: net.Socket, cut: () => void): void {
    const id = this.nextConnection++;
    this.connectionsOpened.push(Date.now());

    const parsed = new Map<string, string>();
    let withholding: { serverDone: () => void } | null = null;
    let bareBytes = 0;

    const frontend = new MessageReader(
      1,
      (type, body) => {
        let record: StatementRecord | null = null;
        if (type === 'P') {
          const [name, next] = cstring(body, 0);
          parsed.set(name, cstring(body, next)[0]);
        } else if (type === 'B') {
          const [, afterPortal] = cstring(body, 0);
          const [name, afterName] = cstring(body, afterPortal);
          record = {
            at: Date.now(),
            connection: id,
            name,
            text: parsed.get(name) ?? null,
            firstParam: firstTextParam(body, afterName),
          };
        } else if (type === 'Q') {
          record = { at: Date.now(), connection: id, name: '', text: cstring(body, 0)[0], firstParam: null };
        }
        if (!record) return;
        this.statements.push(record);
        if (withholding) return;
        const index = this.interceptors.findIndex((i) => i.match(record));
        if (index < 0) return;
        const [interceptor] = this.interceptors.splice(index, 1);
        const done = deferred<void>();
        withholding = { serverDone: done.resolve };
        interceptor!.resolve({ connection: id, statement: record, serverDone: done.promise, cut });
      },
      (code) => {
        if (code === SSL_REQUEST || code === GSSENC_REQUEST) bareBytes++;
      },
    );
    const backend = new MessageReader(0, (type) => {
      if (type === 'Z' && withholding) withholding.serverDone();
    });

    client.on('data', (chunk: Buffer) => {
      // Parse first: an interception must be armed before the server can answer.
      frontend.push(chunk);
      upstream.write(chunk);
    });
    upstream.on('data', (chunk: Buffer) => {
      // The backend answers a TLS/GSS request with one bare byte, outside the message framing.
      const skip = Math.min(bareBytes, chunk.length);
      bareBytes -= skip;
      backend.push(chunk.subarray(skip));
      if (!withholding) client.write(chunk);
    });
  }
}
