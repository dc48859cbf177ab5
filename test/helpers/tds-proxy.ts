import net from 'node:net';
import { WireProxy } from './tcp-proxy.js';
import { deferred } from './wait-for.js';

/**
 * A TCP proxy between one worker process and SQL Server that the test controls: the TDS
 * counterpart of PgProxy. It reads the packet framing as bytes pass (8-byte header, length,
 * end-of-message bit) and recognises the statements it was told about by their text, so a
 * drill can:
 * - count the statements a process sends, from the wire rather than the library's counters;
 * - let one statement reach the server, withhold the server's reply from the worker, then cut
 *   the connection: "the completion commits but the reply never arrives".
 *
 * Plain TDS only: a TLS session would hide the packets. `urlFor` therefore sets
 * `encrypt=false`, with which tedious asks for no encryption at all (not even of the login),
 * and SQL Server agrees unless it forces encryption. Test servers only.
 */

/** Client packet types that carry statement text: an SQL batch, or an RPC (sp_executesql). */
const SQL_BATCH = 0x01;
const RPC_REQUEST = 0x03;
const HEADER_BYTES = 8;
const END_OF_MESSAGE = 0x01;

/** One statement the proxy recognised on its way to the server. */
export interface TdsStatementRecord {
  at: number;
  connection: number;
  kind: string;
}

/** A connection whose replies are being withheld, after a chosen statement was sent. */
export interface TdsHeldReply {
  connection: number;
  /** Resolves when the server sent the last packet of its reply: the statement has finished. */
  serverDone: Promise<void>;
  /** Closes both sides: the worker sees its connection drop and never gets the reply. */
  cut(): void;
}

/** Joins TDS packets into messages (a message ends with the packet whose status has bit 0x01). */
class TdsMessageReader {
  private buffer: Buffer = Buffer.alloc(0);
  private parts: Buffer[] = [];

  constructor(private readonly onMessage: (type: number, payload: Buffer) => void) {}

  push(chunk: Buffer): void {
    this.buffer = this.buffer.length === 0 ? chunk : Buffer.concat([this.buffer, chunk]);
    while (this.buffer.length >= HEADER_BYTES) {
      const length = this.buffer.readUInt16BE(2);
      if (length < HEADER_BYTES) throw new Error(`not a TDS packet (length ${length}): is the connection encrypted?`);
      if (this.buffer.length < length) return;
      const type = this.buffer[0]!;
      const status = this.buffer[1]!;
      this.parts.push(this.buffer.subarray(HEADER_BYTES, length));
      this.buffer = this.buffer.subarray(length);
      if (status & END_OF_MESSAGE) {
        const payload = Buffer.concat(this.parts);
        this.parts = [];
        this.onMessage(type, payload);
      }
    }
  }
}

export class TdsProxy extends WireProxy {
  readonly statements: TdsStatementRecord[] = [];
  /** Framing errors: a non-empty list means the proxy could not read this traffic. */
  readonly problems: string[] = [];
  private readonly interceptors: { kind: string; resolve: (held: TdsHeldReply) => void }[] = [];
  /** Each kind's statement text as it travels: UTF-16LE, inside an SQL batch or an RPC parameter. */
  private readonly markers: [string, Buffer][];
  private nextConnection = 1;

  private constructor(server: net.Server, target: { host: string; port: number }, statements: Record<string, string>) {
    super(server, target);
    this.markers = Object.entries(statements).map(([kind, text]) => [kind, Buffer.from(text, 'utf16le')]);
  }

  /**
   * Listens on a free local port and forwards to the server named in `url`. `statements`
   * names the statement texts to recognise (kind → exact text the client sends).
   */
  static start(url: string, statements: Record<string, string>): Promise<TdsProxy> {
    const parsed = new URL(url.replace(/^sqlserver:/i, 'mssql:'));
    return WireProxy.listen(
      (server) => new TdsProxy(server, { host: parsed.hostname, port: Number(parsed.port || 1433) }, statements),
    );
  }

  /** `url` pointing at this proxy, with encryption off so that the packets can be read. */
  override urlFor(url: string): string {
    const parsed = new URL(super.urlFor(url.replace(/^sqlserver:/i, 'mssql:')));
    for (const name of [...parsed.searchParams.keys()]) {
      if (name.toLowerCase() === 'encrypt') parsed.searchParams.delete(name);
    }
    parsed.searchParams.set('encrypt', 'false');
    return parsed.toString();
  }

  /** Statements of `kind` sent in [from, to). */
  count(kind: string, from = 0, to = Infinity): number {
    return this.statements.filter((s) => s.kind === kind && s.at >= from && s.at < to).length;
  }

  /**
   * The next connection on which a statement of `kind` is sent: that statement still reaches
   * the server, but nothing the server sends afterwards reaches the client.
   */
  holdReplyAfter(kind: string): Promise<TdsHeldReply> {
    const held = deferred<TdsHeldReply>();
    this.interceptors.push({ kind, resolve: held.resolve });
    return held.promise;
  }

  private classify(payload: Buffer): string | null {
    for (const [kind, marker] of this.markers) if (payload.indexOf(marker) >= 0) return kind;
    return null;
  }

  protected relay(client: net.Socket, upstream: net.Socket, cut: () => void): void {
    const id = this.nextConnection++;
    let withholding: { serverDone: () => void } | null = null;
    let readable = true;
    const guard = (read: () => void) => {
      if (!readable) return;
      try {
        read();
      } catch (error) {
        // Unreadable traffic is still forwarded; the drill then fails on what it waits for.
        readable = false;
        this.problems.push(`connection ${id}: ${(error as Error).message}`);
      }
    };

    const fromClient = new TdsMessageReader((type, payload) => {
      if (type !== SQL_BATCH && type !== RPC_REQUEST) return;
      const kind = this.classify(payload);
      if (!kind) return;
      this.statements.push({ at: Date.now(), connection: id, kind });
      if (withholding) return;
      const index = this.interceptors.findIndex((i) => i.kind === kind);
      if (index < 0) return;
      const [interceptor] = this.interceptors.splice(index, 1);
      const done = deferred<void>();
      withholding = { serverDone: done.resolve };
      interceptor!.resolve({ connection: id, serverDone: done.promise, cut });
    });
    // TDS is half-duplex without MARS: the first whole message after the request is its reply.
    const fromServer = new TdsMessageReader(() => withholding?.serverDone());

    client.on('data', (chunk: Buffer) => {
      // Parse first: an interception must be armed before the server can answer.
      guard(() => fromClient.push(chunk));
      upstream.write(chunk);
    });
    upstream.on('data', (chunk: Buffer) => {
      guard(() => fromServer.push(chunk));
      if (!withholding) client.write(chunk);
    });
  }
}
