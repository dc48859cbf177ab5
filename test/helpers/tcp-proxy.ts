import net from 'node:net';

/**
 * A plain TCP proxy between an application and its database that a test can cut, to make the
 * database unreachable without stopping it (other test files share the server).
 * - `cut('reset')`: every connection, open or new, is closed at once (a refused database).
 * - `cut('blackhole')`: connections stay open but nothing passes either way, and new ones are
 *   accepted and left silent (a network partition): only the application's own timeouts end
 *   its waits.
 * `restore()` closes whatever the cut left hanging and lets new connections through again.
 */
/** Listens on a free port of 127.0.0.1. */
export function listenOnFreePort(server: net.Server): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => resolve());
  });
}

/** A database URL with its host and port replaced by a local proxy's. */
export function urlThrough(url: string, port: number): string {
  const parsed = new URL(url);
  parsed.hostname = '127.0.0.1';
  parsed.port = String(port);
  return parsed.toString();
}

export class TcpProxy {
  private readonly pairs = new Set<{ client: net.Socket; upstream: net.Socket | null }>();
  private mode: 'open' | 'reset' | 'blackhole' = 'open';

  private constructor(
    private readonly server: net.Server,
    private readonly target: { host: string; port: number },
  ) {
    server.on('connection', (client) => this.accept(client));
  }

  /** Listens on a free local port and forwards to host:port. */
  static async start(target: { host: string; port: number }): Promise<TcpProxy> {
    const server = net.createServer();
    const proxy = new TcpProxy(server, target);
    await listenOnFreePort(server);
    return proxy;
  }

  /** A proxy in front of the server a database URL names. */
  static forUrl(url: string, defaultPort: number): Promise<TcpProxy> {
    const parsed = new URL(url);
    return TcpProxy.start({ host: parsed.hostname, port: Number(parsed.port || defaultPort) });
  }

  get port(): number {
    return (this.server.address() as net.AddressInfo).port;
  }

  /** `url` with its host and port pointing at this proxy. */
  urlFor(url: string): string {
    return urlThrough(url, this.port);
  }

  get connections(): number {
    return this.pairs.size;
  }

  cut(mode: 'reset' | 'blackhole' = 'reset'): void {
    this.mode = mode;
    for (const pair of this.pairs) {
      if (mode === 'reset') this.destroy(pair);
      else {
        pair.client.pause();
        pair.upstream?.pause();
      }
    }
  }

  restore(): void {
    // Connections held silent during a blackhole are broken for their users anyway.
    for (const pair of this.pairs) this.destroy(pair);
    this.mode = 'open';
  }

  async close(): Promise<void> {
    for (const pair of this.pairs) this.destroy(pair);
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  private destroy(pair: { client: net.Socket; upstream: net.Socket | null }): void {
    pair.client.destroy();
    pair.upstream?.destroy();
    this.pairs.delete(pair);
  }

  private accept(client: net.Socket): void {
    client.on('error', () => undefined);
    if (this.mode === 'reset') {
      client.destroy();
      return;
    }
    const pair: { client: net.Socket; upstream: net.Socket | null } = { client, upstream: null };
    this.pairs.add(pair);
    client.on('close', () => this.destroy(pair));
    if (this.mode === 'blackhole') {
      client.pause();
      return;
    }
    const upstream = net.connect(this.target.port, this.target.host);
    pair.upstream = upstream;
    upstream.on('error', () => undefined);
    upstream.on('close', () => this.destroy(pair));
    client.pipe(upstream);
    upstream.pipe(client);
  }
}

/**
 * The plumbing shared by the proxies that read a database's wire protocol as it passes
 * (PgProxy, TdsProxy): a server on a free local port, and every accepted connection paired
 * with one to the database; either side ending ends both, as a real network path would.
 * Subclasses read the two byte streams in `relay`.
 */
export abstract class WireProxy {
  private readonly sockets = new Set<net.Socket>();

  protected constructor(
    private readonly server: net.Server,
    private readonly target: { host: string; port: number },
  ) {
    server.on('connection', (client) => this.pair(client));
  }

  /** Starts a subclass on a free port of 127.0.0.1. */
  protected static async listen<P extends WireProxy>(create: (server: net.Server) => P): Promise<P> {
    const server = net.createServer();
    const proxy = create(server);
    await listenOnFreePort(server);
    return proxy;
  }

  get port(): number {
    return (this.server.address() as net.AddressInfo).port;
  }

  /** `url` with its host and port pointing at this proxy. */
  urlFor(url: string): string {
    return urlThrough(url, this.port);
  }

  async close(): Promise<void> {
    for (const socket of this.sockets) socket.destroy();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  /** Forwards (or withholds) the bytes of one connection pair; `cut` closes both sides. */
  protected abstract relay(client: net.Socket, upstream: net.Socket, cut: () => void): void;

  private pair(client: net.Socket): void {
    const upstream = net.connect(this.target.port, this.target.host);
    this.sockets.add(client);
    this.sockets.add(upstream);
    const cut = () => {
      client.destroy();
      upstream.destroy();
    };
    for (const socket of [client, upstream]) {
      socket.on('error', () => undefined);
      socket.on('close', () => {
        this.sockets.delete(socket);
        cut();
      });
    }
    this.relay(client, upstream, cut);
  }
}
