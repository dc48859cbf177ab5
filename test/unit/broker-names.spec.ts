import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import {
  assertBrokerName,
  assertDerivedQueueName,
  BROKER_ACTIVATION_NOTIFICATION,
  BROKER_DISABLED_NOTIFICATION,
  BROKER_EVENT,
  BROKER_SYSTEM,
  brokerDefaultNames,
  brokerNotificationQueue,
  brokerNotificationService,
  brokerObjectText,
  brokerStringLiteral,
  parseBrokerQueueName,
  quoteBrokerObject,
} from '../../lib/src/broker/broker.names.js';
import { SqlQueueConfigError } from '../../lib/src/core/errors.js';

describe('Service Broker system names', () => {
  it('are the exact http:// names SQL Server defines', () => {
    expect(BROKER_SYSTEM).toEqual({
      END_DIALOG: 'http://schemas.microsoft.com/SQL/ServiceBroker/EndDialog',
      ERROR: 'http://schemas.microsoft.com/SQL/ServiceBroker/Error',
      DIALOG_TIMER: 'http://schemas.microsoft.com/SQL/ServiceBroker/DialogTimer',
      POST_EVENT_NOTIFICATION: 'http://schemas.microsoft.com/SQL/Notifications/PostEventNotification',
      EVENT_NOTIFICATION: 'http://schemas.microsoft.com/SQL/Notifications/EventNotification',
    });
    for (const name of Object.values(BROKER_SYSTEM))
      expect(name.startsWith('http://schemas.microsoft.com/SQL/')).toBe(true);
    expect(BROKER_EVENT).toEqual({
      QUEUE_ACTIVATION: 'QUEUE_ACTIVATION',
      BROKER_QUEUE_DISABLED: 'BROKER_QUEUE_DISABLED',
    });
  });

  it('never appear with https:// anywhere in lib/src/broker (that spelling silently matches nothing)', () => {
    const dir = join(import.meta.dirname, '../../lib/src/broker');
    const files = readdirSync(dir).filter((f) => f.endsWith('.ts'));
    expect(files.length).toBeGreaterThan(0);
    for (const file of files) {
      const text = readFileSync(join(dir, file), 'utf8');
      expect(text, file).not.toMatch(/https:\/\/schemas\.microsoft\.com/i);
    }
  });
});

describe('derived broker names', () => {
  it('follow the documented pattern from the module schema and the broker queue name', () => {
    expect(brokerDefaultNames('app', 'orders.v2')).toEqual({
      queue: { schema: 'app', name: 'orders.v2_TargetQueue' },
      initiatorQueue: { schema: 'app', name: 'orders.v2_InitiatorQueue' },
      service: 'nestjs-sql-queue/app/orders.v2/target',
      initiatorService: 'nestjs-sql-queue/app/orders.v2/initiator',
      contract: 'nestjs-sql-queue/app/orders.v2/contract',
      messageType: 'nestjs-sql-queue/app/orders.v2/message',
      closeMessageType: 'nestjs-sql-queue/app/orders.v2/close',
    });
    expect(brokerNotificationQueue('app')).toEqual({ schema: 'app', name: 'BrokerActivationQueue' });
    expect(brokerNotificationService('app')).toBe('nestjs-sql-queue/app/activation');
    expect([BROKER_ACTIVATION_NOTIFICATION, BROKER_DISABLED_NOTIFICATION]).toEqual([
      'sqlqueue_activation',
      'sqlqueue_disabled',
    ]);
  });

  it('quote and print schema-scoped names', () => {
    expect(quoteBrokerObject({ schema: 'app', name: 'a.b-c_TargetQueue' })).toBe('[app].[a.b-c_TargetQueue]');
    expect(brokerObjectText({ schema: 'app', name: 'q' })).toBe('app.q');
    expect(brokerStringLiteral('a/b')).toBe("N'a/b'");
    expect(brokerStringLiteral("it's")).toBe("N'it''s'");
  });
});

describe('broker name validation', () => {
  it("takes a queue as 'name' in the module schema or as 'schema.name'", () => {
    expect(parseBrokerQueueName('opt', 'Work_1', 'app')).toEqual({ schema: 'app', name: 'Work_1' });
    expect(parseBrokerQueueName('opt', 'ops._q', 'app')).toEqual({ schema: 'ops', name: '_q' });
    for (const bad of ['', 'a.b.c', '1q', 'a-b', 'x.', '.x', 'a b', 'q]', "q'", 'x'.repeat(129), 7, null]) {
      expect(() => parseBrokerQueueName("broker.queues['o'].queue", bad, 'app')).toThrow(SqlQueueConfigError);
    }
    expect(() => parseBrokerQueueName("broker.queues['o'].queue", 'a b', 'app')).toThrow(
      "broker.queues['o'].queue 'a b' is invalid: write 'name' (in schema 'app') or 'schema.name', each part starting with a letter or '_', then letters, digits or '_' (max 128 characters)",
    );
  });

  it('takes Service Broker names of letters, digits and _ . : / - up to 128 characters', () => {
    for (const good of [
      'a',
      'nestjs-sql-queue/app/orders/target',
      '//Adventure-Works.com/Expenses',
      'x:y',
      'x'.repeat(128),
    ]) {
      expect(assertBrokerName('opt', good)).toBe(good);
    }
    for (const bad of ['', 'a b', "a'b", 'a]b', '[a]', 'a;b', 'x'.repeat(129), 1]) {
      expect(() => assertBrokerName("broker.queues['o'].service", bad)).toThrow(
        /broker\.queues\['o'\]\.service .* is invalid: use letters, digits, '_', '\.', ':', '\/', '-' \(1 to 128 characters; no spaces, quotes or brackets\)/,
      );
    }
  });

  it('refuses DEFAULT and ANY, which Service Broker reserves', () => {
    for (const bad of ['DEFAULT', 'default', 'Any']) {
      expect(() => assertBrokerName("broker.queues['o'].contract", bad)).toThrow(
        /is reserved by Service Broker .*: choose another name/,
      );
    }
  });

  it('says which option to set when a derived name is too long', () => {
    const long = `nestjs-sql-queue/app/${'q'.repeat(120)}/target`;
    expect(() => assertBrokerName("broker.queues['q'].service", long, true)).toThrow(
      /^broker\.queues\['q'\]\.service: the default '.*' is longer than 128 characters: set broker\.queues\['q'\]\.service explicitly/,
    );
    expect(() =>
      assertDerivedQueueName("broker.queues['q'].queue", { schema: 'app', name: `${'q'.repeat(120)}_TargetQueue` }),
    ).toThrow(
      /^broker\.queues\['q'\]\.queue: the default '.*' is longer than 128 characters .*: set broker\.queues\['q'\]\.queue explicitly/,
    );
  });
});
