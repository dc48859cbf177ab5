import { describe, expect, it } from 'vitest';
import { resolveBrokerOptions } from '../../lib/src/broker/broker.options.js';
import { BrokerReceiver } from '../../lib/src/broker/reader/broker.receiver.js';
import { moveMessages, waitForMessages } from '../../lib/src/broker/reader/broker.receiver.queries.js';
import type { QueueEventListener } from '../../lib/src/core/events.js';
import { BrokerDriverDouble, brokerError } from '../helpers/broker-driver-double.js';
import { CaptureLogger } from '../helpers/capture-logger.js';
import { DEFAULT_MAX_PAYLOAD_BYTES } from '../../lib/src/core/validation.js';

const options = resolveBrokerOptions({ queues: { orders: { messagesPerTransaction: 50 } } }, 'sqlqueue')!;
const queue = options.queues[0]!;
const WAIT = waitForMessages(queue.queue);
const MOVE = moveMessages('sqlqueue', queue, DEFAULT_MAX_PAYLOAD_BYTES);

function setup() {
  const driver = new BrokerDriverDouble({ strict: true });
  const logger = new CaptureLogger();
  const moved: { queue: string; received: number; moved: number; ended: number }[] = [];
  const listener: QueueEventListener = { brokerMoved: (event) => void moved.push(event) };
  let wakes = 0;
  const receiver = new BrokerReceiver({
    driver,
    schema: 'sqlqueue',
    queue,
    waitTimeoutMs: 5_000,
    maxBodyBytes: DEFAULT_MAX_PAYLOAD_BYTES,
    maxAttempts: 7,
    logger,
    listeners: [listener],
    onMoved: () => void wakes++,
  });
  const label = (text: string) => (text === WAIT ? 'wait' : text === MOVE ? 'move' : text);
  return { driver, logger, moved, receiver, wakes: () => wakes, log: () => driver.log(label) };
}

const moveRow = (received: number, moved = received, ended = 0, errors: string | null = null) => [
  { Received: received, Moved: moved, Ended: ended, Errors: errors },
];

describe('BrokerReceiver', () => {
  it('waits in autocommit, moves in one batch, keeps moving while messages come, then waits again', async () => {
    const { driver, receiver, moved, wakes, log } = setup();
    driver.once(WAIT, () => [{ Ready: 1 }]);
    driver.once(MOVE, () => moveRow(50));
    driver.once(MOVE, () => moveRow(3, 2, 1));
    driver.once(MOVE, () => moveRow(0));
    driver.once(WAIT, () => [{ Ready: 0 }]);
    expect(await receiver.runOnce()).toBe('handled');
    expect(await receiver.runOnce()).toBe('handled'); // no wait: the last move found messages
    expect(await receiver.runOnce()).toBe('empty'); // another receiver took the rest
    expect(await receiver.runOnce()).toBe('empty'); // the wait timed out
    expect(log()).toEqual([
      'connection#1 begin',
      'connection#1 wait',
      'connection#1 move',
      'connection#1 move',
      'connection#1 move',
      'connection#1 wait',
    ]);
    expect(driver.paramsOf(WAIT)).toEqual({ timeoutMs: { type: 'int', value: 5_000 } });
    expect(driver.paramsOf(MOVE)).toEqual({
      queue: { type: 'nvarchar', value: 'orders' },
      maxAttempts: { type: 'int', value: 7 },
    });
    expect(moved).toEqual([
      { queue: 'orders', received: 50, moved: 50, ended: 0 },
      { queue: 'orders', received: 3, moved: 2, ended: 1 },
    ]);
    expect(wakes()).toBe(2);
    // Only its own connection: no transaction of the reader pool, nothing on the shared pool.
    expect(driver.sessions).toEqual([]);
    await receiver.stop();
    driver.assertDiscipline({ allEnded: true });
  });

  it('a move that only ended conversations wakes no handler', async () => {
    const { driver, receiver, wakes, moved } = setup();
    driver.once(WAIT, () => [{ Ready: true }]);
    driver.once(MOVE, () => moveRow(1, 0, 1));
    expect(await receiver.runOnce()).toBe('handled');
    expect(wakes()).toBe(0);
    expect(moved).toEqual([{ queue: 'orders', received: 1, moved: 0, ended: 1 }]);
    await receiver.stop();
  });

  it('stop during the idle wait cancels it at once and closes the connection: nothing was received', async () => {
    const { driver, receiver, log } = setup();
    const wait = driver.hold(WAIT);
    const run = receiver.runOnce();
    await wait.reached;
    await receiver.stop();
    await expect(run).resolves.toBe('stopped');
    expect(log()).toEqual(['connection#1 begin', 'connection#1 wait', 'connection#1 cancel', 'connection#1 close']);
    await expect(receiver.runOnce()).resolves.toBe('stopped');
    driver.assertDiscipline({ allEnded: true });
  });

  it('stop during a move lets it finish (its commit is on the server), then closes', async () => {
    const { driver, receiver, log, moved } = setup();
    driver.once(WAIT, () => [{ Ready: 1 }]);
    const move = driver.hold(MOVE);
    const run = receiver.runOnce();
    await move.reached;
    expect(receiver.busy).toBe(true);
    const stopping = receiver.stop();
    move.release(moveRow(4));
    await stopping;
    await expect(run).resolves.toBe('stopped');
    expect(receiver.busy).toBe(false);
    expect(moved).toHaveLength(1);
    expect(log()).toEqual(['connection#1 begin', 'connection#1 wait', 'connection#1 move', 'connection#1 close']);
    driver.assertDiscipline({ allEnded: true });
  });

  it('after any failure the connection is closed and the next round opens a new one', async () => {
    const { driver, receiver, log } = setup();
    driver.once(WAIT, () => [{ Ready: 1 }]);
    driver.once(MOVE, () => {
      throw brokerError(1222, 'Lock request time out period exceeded.');
    });
    driver.once(WAIT, () => [{ Ready: 1 }]);
    driver.once(MOVE, () => moveRow(1));
    await expect(receiver.runOnce()).rejects.toThrow(/Lock request time out/);
    // The failed move gave its messages back; the receiver waits again before moving.
    expect(await receiver.runOnce()).toBe('handled');
    expect(log()).toEqual([
      'connection#1 begin',
      'connection#1 wait',
      'connection#1 move',
      'connection#1 close',
      'connection#2 begin',
      'connection#2 wait',
      'connection#2 move',
    ]);
    await receiver.stop();
    driver.assertDiscipline({ allEnded: true });
  });

  it('a failed wait (server gone) also closes the connection; a refused connection rejects the round', async () => {
    const { driver, receiver } = setup();
    driver.once(WAIT, () => {
      throw Object.assign(new Error('Connection lost - read ECONNRESET'), { code: 'ESOCKET' });
    });
    await expect(receiver.runOnce()).rejects.toThrow(/ECONNRESET/);
    expect(driver.connections[0]!.closed).toBe(true);
    driver.openConnection = () => Promise.reject(new Error('Failed to connect'));
    await expect(receiver.runOnce()).rejects.toThrow(/Failed to connect/);
    await receiver.stop();
  });

  it('logs each Error message that ended a conversation, with its code and description', async () => {
    const { driver, receiver, logger } = setup();
    const body = Buffer.from(
      '\uFEFF<Error xmlns="http://schemas.microsoft.com/SQL/ServiceBroker/Error"><Code>-8489</Code><Description>The dialog has exceeded the specified LIFETIME.</Description></Error>',
      'utf16le',
    );
    driver.once(WAIT, () => [{ Ready: 1 }]);
    driver.once(MOVE, () =>
      moveRow(1, 0, 1, JSON.stringify([{ conversationHandle: 'ABC', body: body.toString('base64') }])),
    );
    await receiver.runOnce();
    expect(logger.lines.filter((line) => line.level === 'warn').map((line) => line.message)).toEqual([
      "broker queue 'orders': conversation ABC ended with an error from the other side (code -8489: The dialog has exceeded the specified LIFETIME.); ended our side",
    ]);
    await receiver.stop();
  });

  it('refuses a second round while one runs', async () => {
    const { driver, receiver } = setup();
    const wait = driver.hold(WAIT);
    const first = receiver.runOnce();
    await wait.reached;
    await expect(receiver.runOnce()).rejects.toThrow(/already running/);
    await receiver.stop();
    await expect(first).resolves.toBe('stopped');
  });
});
