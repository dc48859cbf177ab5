import net from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { listenOnFreePort } from '../helpers/tcp-proxy.js';
import { TdsProxy } from '../helpers/tds-proxy.js';
import { deferred } from '../helpers/wait-for.js';

// The SQL Server drills cannot run here, so the proxy they rely on is checked against a fake
// server speaking bare TDS framing: 8-byte header (type, status, big-endian length, …), a
// message ending with the packet whose status has bit 0x01.

const RPC = 0x03;
const REPLY = 0x04;

function packet(type: number, payload: Buffer, last: boolean): Buffer {
  const header = Buffer.alloc(8);
  header[0] = type;
  header[1] = last ? 0x01 : 0x00;
  header.writeUInt16BE(8 + payload.length, 2);
  return Buffer.concat([header, payload]);
}

/** An RPC carrying `text` as UTF-16LE, split over packets of at most `size` payload bytes. */
function rpc(text: string, size = 64): Buffer {
  const payload = Buffer.concat([Buffer.from([0xff, 0xff, 0x0a, 0x00]), Buffer.from(text, 'utf16le')]);
  const packets: Buffer[] = [];
  for (let at = 0; at < payload.length; at += size) {
    packets.push(packet(RPC, payload.subarray(at, at + size), at + size >= payload.length));
  }
  return Buffer.concat(packets);
}

/** A server that answers every whole client message with a two-packet reply. */
async function fakeServer(): Promise<{ port: number; received: Buffer[]; close: () => Promise<void> }> {
  const received: Buffer[] = [];
  const sockets = new Set<net.Socket>();
  const server = net.createServer((socket) => {
    sockets.add(socket);
    socket.on('error', () => undefined);
    let pending = Buffer.alloc(0);
    socket.on('data', (chunk: Buffer) => {
      received.push(chunk);
      pending = Buffer.concat([pending, chunk]);
      while (pending.length >= 8 && pending.length >= pending.readUInt16BE(2)) {
        const last = (pending[1]! & 0x01) === 0x01;
        pending = pending.subarray(pending.readUInt16BE(2));
        if (!last) continue;
        socket.write(packet(REPLY, Buffer.from('first half'), false));
        setTimeout(() => socket.write(packet(REPLY, Buffer.from('second half'), true)), 20);
      }
    });
  });
  await listenOnFreePort(server);
  return {
    port: (server.address() as net.AddressInfo).port,
    received,
    close: async () => {
      for (const socket of sockets) socket.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

describe('TdsProxy (the SQL Server drills’ wire)', () => {
  const cleanups: (() => Promise<void>)[] = [];
  afterEach(async () => {
    for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
  });

  async function setup() {
    const server = await fakeServer();
    cleanups.push(server.close);
    const url = `mssql://sa:x@127.0.0.1:${server.port}/db?Encrypt=true&trustServerCertificate=true`;
    const proxy = await TdsProxy.start(url, {
      complete: 'UPDATE j SET [State] = \u0027done\u0027',
      heartbeat: 'SET [LeaseUntil] = DATEADD',
    });
    cleanups.push(() => proxy.close());
    const client = net.connect(proxy.port, '127.0.0.1');
    client.on('error', () => undefined);
    cleanups.push(async () => void client.destroy());
    const replies: Buffer[] = [];
    client.on('data', (chunk: Buffer) => replies.push(chunk));
    await new Promise((resolve) => client.once('connect', resolve));
    return { server, proxy, client, replies, url };
  }

  it('points a URL at itself with encryption off, whatever the case of the parameter', async () => {
    const { proxy, url } = await setup();
    const through = new URL(proxy.urlFor(url));
    expect(through.port).toBe(String(proxy.port));
    expect([...through.searchParams.entries()]).toEqual([
      ['trustServerCertificate', 'true'],
      ['encrypt', 'false'],
    ]);
  });

  it('recognises statements split over packets and counts them by kind and time', async () => {
    const { proxy, client, replies } = await setup();
    const before = Date.now();
    client.write(rpc(`DECLARE @x int; UPDATE j SET [State] = 'done' WHERE 1 = 0;`, 16));
    client.write(rpc('SELECT 1;'));
    await expect.poll(() => Buffer.concat(replies).includes(Buffer.from('second half'))).toBe(true);
    expect(proxy.count('complete')).toBe(1);
    expect(proxy.count('complete', Date.now() + 1_000)).toBe(0);
    expect(proxy.count('heartbeat', before)).toBe(0);
    expect(proxy.problems).toEqual([]);
  });

  it('lets the held statement reach the server, withholds the whole reply, and cuts the connection', async () => {
    const { proxy, server, client, replies } = await setup();
    const held = proxy.holdReplyAfter('complete');
    const closed = deferred<void>();
    client.on('close', () => closed.resolve());
    client.write(rpc(`UPDATE j SET [State] = 'done';`));
    const reply = await held;
    await reply.serverDone;
    // The server got the statement and answered in full; the client got none of it.
    expect(Buffer.concat(server.received).includes(Buffer.from("[State] = 'done'", 'utf16le'))).toBe(true);
    expect(replies).toEqual([]);
    reply.cut();
    await closed.promise;
    expect(replies).toEqual([]);
  });
});
