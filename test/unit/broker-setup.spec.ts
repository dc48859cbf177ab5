import { describe, expect, it } from 'vitest';
import { resolveBrokerOptions } from '../../lib/src/broker/broker.options.js';
import {
  applyBrokerSetup,
  assessBrokerSetup,
  brokerBootDecision,
  brokerEnableQueueStatement,
  brokerEnableStatement,
  brokerEventNotificationBatch,
  brokerGrantsScript,
  brokerObservationQuery,
  brokerSetupBatches,
  brokerSetupLock,
  brokerSetupScript,
  brokerTeardownBatches,
  parseBrokerObservation,
  type BrokerSetupAssessment,
} from '../../lib/src/broker/setup/broker.setup.js';
import type {
  BrokerDriver,
  BrokerOptions,
  BrokerRow,
  BrokerSession,
  ResolvedBrokerOptions,
} from '../../lib/src/broker/broker.types.js';
import { SqlQueueConfigError } from '../../lib/src/core/errors.js';
import { CUSTOM_BROKER_NAMES, healthyBrokerObservationRows as healthyRows } from '../helpers/broker-observation.js';
import { MSSQL_OWN_TRANSACTION_GUARD } from '../../lib/src/store/mssql/mssql.queries.js';
import { checkTsqlWithKnownGaps } from '../helpers/tsql-grammar.js';

const resolve = (raw: BrokerOptions, schema = 'sqlqueue') => resolveBrokerOptions(raw, schema, [])!;

/** Two schemas; default names, custom names, a queue in another schema, an xml queue. */
const CONFIGS: Record<string, ResolvedBrokerOptions> = {
  defaults: resolve({ queues: { orders: {}, 'billing.v2-eu': { format: 'xml' } } }),
  custom: resolve(
    {
      queues: {
        work: {
          ...CUSTOM_BROKER_NAMES,
        },
        mail: { format: 'raw' },
      },
    },
    'app_2',
  ),
};

const GRANTEES = { readers: 'queue_reader', senders: 'DOMAIN\\app sender', admin: 'queue.admin' };

function batchesOf(script: string): string[] {
  return script
    .split(/^GO$/m)
    .map((b) => b.trim())
    .filter((b) => b !== '');
}

function expectValidTsql(batch: string): void {
  const result = checkTsqlWithKnownGaps(batch);
  expect(result.errors, batch).toEqual([]);
  expect(result.ok).toBe(true);
}

/** RECEIVE, WAITFOR, SEND, BEGIN DIALOG, … must start the batch or follow a statement ended by ';'. */
const BROKER_STATEMENT =
  /^\s*(?:WAITFOR\s*\(|RECEIVE\b|SEND\s+ON\b|BEGIN\s+DIALOG\b|END\s+CONVERSATION\b|GET\s+CONVERSATION\s+GROUP\b|BEGIN\s+CONVERSATION\s+TIMER\b|MOVE\s+CONVERSATION\b)/im;
function brokerStatementsNotAfterSemicolon(batch: string): string[] {
  const bad: string[] = [];
  const lines = batch.split('\n');
  lines.forEach((line, i) => {
    if (!BROKER_STATEMENT.test(line)) return;
    const before = lines
      .slice(0, i)
      .join('\n')
      .replace(/--[^\n]*/g, '')
      .trimEnd();
    if (before !== '' && !before.endsWith(';') && !/\b(?:BEGIN|ELSE)$/i.test(before)) bad.push(line.trim());
  });
  return bad;
}

describe.each(Object.entries(CONFIGS))('broker setup SQL (%s names)', (_label, options) => {
  const everyBatch = () => [
    ...brokerSetupBatches(options),
    ...batchesOf(brokerSetupScript(options)),
    ...brokerTeardownBatches(options),
    ...options.queues.map((q) => brokerEventNotificationBatch(q, options)),
    ...batchesOf(brokerGrantsScript(options, GRANTEES)),
    brokerObservationQuery(options).text,
    brokerSetupLock(options.schema).text,
    `${MSSQL_OWN_TRANSACTION_GUARD}${brokerSetupLock(options.schema).text}`,
    brokerEnableStatement(),
    brokerEnableQueueStatement(options.queues[0]!.queue),
  ];

  it('passes the T-SQL grammar gate, batch by batch and as the printed script', () => {
    for (const batch of everyBatch()) expectValidTsql(batch);
  });

  it('checks the event notification and GRANT statements through their known grammar gaps, not blindly', () => {
    const gaps = [...brokerSetupBatches(options), ...batchesOf(brokerGrantsScript(options, GRANTEES))].flatMap(
      (b) => checkTsqlWithKnownGaps(b).gapStatements,
    );
    expect(new Set(gaps.map((g) => g.gap))).toEqual(
      new Set(['event-notification-on-two-part-queue', 'grant-permissions']),
    );
    expect(gaps.filter((g) => g.gap === 'event-notification-on-two-part-queue')).toHaveLength(
      options.queues.length * 2,
    );
  });

  it('puts no Service Broker statement after a statement that lacks its ;', () => {
    for (const batch of everyBatch()) expect(brokerStatementsNotAfterSemicolon(batch), batch).toEqual([]);
    // The check itself bites.
    expect(brokerStatementsNotAfterSemicolon('SET NOCOUNT ON\nRECEIVE TOP (1) * FROM q;')).toHaveLength(1);
    expect(brokerStatementsNotAfterSemicolon('SET NOCOUNT ON;\nRECEIVE TOP (1) * FROM q;')).toEqual([]);
  });

  it('guards every CREATE with an existence check against the right catalog view', () => {
    const guards: [RegExp, RegExp][] = [
      [/CREATE MESSAGE TYPE/, /^IF NOT EXISTS \(SELECT 1 FROM sys\.service_message_types WHERE name = N'/],
      [/CREATE CONTRACT/, /^IF NOT EXISTS \(SELECT 1 FROM sys\.service_contracts WHERE name = N'/],
      [/CREATE QUEUE/, /^IF NOT EXISTS \(SELECT 1 FROM sys\.service_queues WHERE schema_id = SCHEMA_ID\(N'/],
      [/CREATE SERVICE/, /^IF NOT EXISTS \(SELECT 1 FROM sys\.services WHERE name = N'/],
      [
        /CREATE EVENT NOTIFICATION/,
        /^IF NOT EXISTS \(SELECT 1 FROM sys\.event_notifications WHERE parent_id = OBJECT_ID\(N'/,
      ],
      [/CREATE SCHEMA/, /^IF SCHEMA_ID\(N'\w+'\) IS NULL EXEC \(N'CREATE SCHEMA/],
    ];
    const batches = brokerSetupBatches(options);
    for (const batch of batches) {
      expect(batch.match(/CREATE /g), batch).toHaveLength(1);
      const guard = guards.find(([create]) => create.test(batch));
      expect(guard, batch).toBeDefined();
      expect(batch).toMatch(guard![1]);
    }
    const kinds = batches.map((b) => guards.findIndex(([create]) => create.test(b)));
    // Schemas, message types, contracts, queues, services, event notifications: each after what it uses.
    expect(kinds).toEqual([...kinds].sort((a, b) => [5, 0, 1, 2, 3, 4].indexOf(a) - [5, 0, 1, 2, 3, 4].indexOf(b)));
  });

  it('creates what the options name, with the documented options', () => {
    const script = brokerSetupScript(options);
    for (const q of options.queues) {
      for (const queue of [q.queue, q.initiatorQueue]) {
        expect(script).toContain(
          `CREATE QUEUE [${queue.schema}].[${queue.name}] WITH STATUS = ON, RETENTION = OFF, POISON_MESSAGE_HANDLING (STATUS = OFF);`,
        );
      }
      expect(script).toContain(
        `CREATE MESSAGE TYPE [${q.messageType}] VALIDATION = ${q.format === 'xml' ? 'WELL_FORMED_XML' : 'NONE'};`,
      );
      expect(script).toContain(`CREATE MESSAGE TYPE [${q.closeMessageType}] VALIDATION = NONE;`);
      expect(script).toContain(
        `CREATE CONTRACT [${q.contract}] ([${q.messageType}] SENT BY INITIATOR, [${q.closeMessageType}] SENT BY INITIATOR);`,
      );
      expect(script).toContain(
        `CREATE SERVICE [${q.service}] ON QUEUE [${q.queue.schema}].[${q.queue.name}] ([${q.contract}]);`,
      );
      // An initiator service lists no contract: it only begins dialogs.
      expect(script).toContain(
        `CREATE SERVICE [${q.initiatorService}] ON QUEUE [${q.initiatorQueue.schema}].[${q.initiatorQueue.name}];`,
      );
      for (const [name, event] of [
        ['sqlqueue_activation', 'QUEUE_ACTIVATION'],
        ['sqlqueue_disabled', 'BROKER_QUEUE_DISABLED'],
      ]) {
        expect(script).toContain(
          `CREATE EVENT NOTIFICATION [${name}] ON QUEUE [${q.queue.schema}].[${q.queue.name}] FOR ${event} TO SERVICE N'${options.notificationService}', N'current database';`,
        );
      }
    }
    expect(script).toContain(
      `CREATE SERVICE [${options.notificationService}] ON QUEUE [${options.schema}].[BrokerActivationQueue] ([http://schemas.microsoft.com/SQL/Notifications/PostEventNotification]);`,
    );
    expect(script).toMatch(/^GO$/m);
  });

  it('prints ENABLE_BROKER only as a comment', () => {
    const script = brokerSetupScript(options);
    const lines = script.split('\n').filter((line) => /ENABLE_BROKER/i.test(line));
    expect(lines).toEqual(['-- ALTER DATABASE CURRENT SET ENABLE_BROKER WITH ROLLBACK IMMEDIATE;']);
    for (const batch of brokerSetupBatches(options)) expect(batch).not.toMatch(/ALTER DATABASE/i);
  });

  it('tears down in an order SQL Server accepts: notifications, services, queues, contracts, message types', () => {
    const order = ['DROP EVENT NOTIFICATION', 'DROP SERVICE', 'DROP QUEUE', 'DROP CONTRACT', 'DROP MESSAGE TYPE'];
    const kinds = brokerTeardownBatches(options).map((b) => order.findIndex((drop) => b.includes(drop)));
    expect(kinds).not.toContain(-1);
    expect(kinds).toEqual([...kinds].sort((a, b) => a - b));
    expect(new Set(kinds).size).toBe(order.length);
    for (const batch of brokerTeardownBatches(options)) expect(batch).toMatch(/^IF EXISTS \(SELECT 1 FROM sys\./);
  });

  it('recreates both event notifications of a queue, dropping any left', () => {
    const q = options.queues[0]!;
    const batch = brokerEventNotificationBatch(q, options);
    expect(batch.match(/DROP EVENT NOTIFICATION/g)).toHaveLength(2);
    expect(batch.match(/CREATE EVENT NOTIFICATION/g)).toHaveLength(2);
    expect(batch.indexOf('DROP EVENT NOTIFICATION [sqlqueue_activation]')).toBeLessThan(
      batch.indexOf('CREATE EVENT NOTIFICATION [sqlqueue_activation]'),
    );
  });

  it('binds every looked-up name as a parameter in the observation query', () => {
    const { text, params } = brokerObservationQuery(options);
    const values = Object.values(params).map((p) => p.value);
    for (const q of options.queues) {
      for (const name of [q.service, q.contract, q.messageType, q.queue.name, q.initiatorQueue.name]) {
        expect(values).toContain(name);
        expect(text).not.toContain(name);
      }
    }
    expect(Object.values(params).every((p) => p.type === 'nvarchar')).toBe(true);
    expect(Object.keys(params).every((name) => text.includes(`@${name}`))).toBe(true);
  });
});

describe('brokerGrantsScript', () => {
  const options = CONFIGS.defaults!;

  it('grants each role what it needs, quoted, and nothing for a role left out', () => {
    const script = brokerGrantsScript(options, { readers: 'r', senders: 'DOMAIN\\s x' });
    expect(script).toContain('GRANT RECEIVE ON [sqlqueue].[orders_TargetQueue] TO [r];');
    expect(script).toContain('GRANT RECEIVE ON [sqlqueue].[BrokerActivationQueue] TO [r];');
    expect(script).toContain('GRANT VIEW DEFINITION ON SERVICE::[nestjs-sql-queue/sqlqueue/activation] TO [r];');
    expect(script).not.toMatch(/BrokerAttempts|BrokerDead/);
    // Receivers enqueue, and every process runs the store: the table queue's runtime grants, for both roles.
    for (const to of ['[r]', '[DOMAIN\\s x]']) {
      expect(script).toContain(`GRANT SELECT, INSERT, UPDATE, DELETE ON SCHEMA::[sqlqueue] TO ${to};`);
      expect(script).toContain(`GRANT UPDATE ON OBJECT::[sqlqueue].[JobIdSequence] TO ${to};`);
      expect(script).toContain(`GRANT EXECUTE ON TYPE::[sqlqueue].[JobInputListV4] TO ${to};`);
    }
    expect(script).toContain('GRANT SEND ON SERVICE::[nestjs-sql-queue/sqlqueue/orders/target] TO [DOMAIN\\s x];');
    expect(script).toContain('GRANT RECEIVE ON [sqlqueue].[orders_InitiatorQueue] TO [DOMAIN\\s x];');
    expect(script).toContain(
      'GRANT REFERENCES ON CONTRACT::[nestjs-sql-queue/sqlqueue/orders/contract] TO [DOMAIN\\s x];',
    );
    expect(script).toContain(
      'GRANT REFERENCES ON MESSAGE TYPE::[nestjs-sql-queue/sqlqueue/orders/message] TO [DOMAIN\\s x];',
    );
    expect(script).not.toMatch(/GRANT ALTER/);
    const admin = brokerGrantsScript(options, { admin: 'a' });
    expect(admin).toContain('GRANT ALTER ON [sqlqueue].[orders_TargetQueue] TO [a];');
    expect(admin).toContain('GRANT SELECT, INSERT, UPDATE, DELETE ON [sqlqueue].[BrokerOutbox] TO [a];');
    expect(admin).not.toMatch(/GRANT RECEIVE/);
  });

  it('refuses a principal that cannot be quoted safely', () => {
    for (const bad of ['a]b', "a'b", 'a;b', ' a', '', 'x'.repeat(129)]) {
      expect(() => brokerGrantsScript(options, { readers: bad })).toThrow(SqlQueueConfigError);
    }
    expect(() => brokerGrantsScript(options, { senders: 'a]b' })).toThrow(
      "the database principal for senders 'a]b' is invalid: use letters, digits, '_', '.', '@', '\\', '-' or inner spaces (1 to 128 characters)",
    );
  });
});

// ---- Observation → assessment → decision

const options = CONFIGS.defaults!;

type Edit = (rows: BrokerRow[]) => void;
const find = (rows: BrokerRow[], kind: string, name: string) => rows.find((r) => r.Kind === kind && r.Name === name)!;
const orders = options.queues[0]!;
const edits: Record<string, Edit> = {
  healthy: () => undefined,
  brokerOff: (rows) => (find(rows, 'database', 'appdb').BrokerEnabled = false),
  queueMissing: (rows) => {
    find(rows, 'queue', orders.queue.name).Present = false;
    for (const r of rows.filter((r) => r.Kind === 'eventNotification' && r.Parent === orders.queue.name))
      r.Present = false;
  },
  notificationMissing: (rows) => (rows.find((r) => r.Kind === 'eventNotification')!.Present = false),
  queueDisabled: (rows) => (find(rows, 'queue', orders.queue.name).ReceiveEnabled = false),
  internalActivation: (rows) =>
    Object.assign(find(rows, 'queue', orders.queue.name), {
      ActivationEnabled: true,
      ActivationProcedure: '[db].[dbo].[p]',
    }),
  poisonOn: (rows) => (find(rows, 'queue', orders.queue.name).PoisonHandling = true),
  serviceElsewhere: (rows) => (find(rows, 'service', orders.service).OnQueue = 'dbo.Other'),
  serviceWithoutContract: (rows) => (find(rows, 'service', orders.service).HasContract = false),
  notificationMisdirected: (rows) => (rows.find((r) => r.Kind === 'eventNotification')!.TargetService = 'elsewhere'),
  xmlTypeOnJson: (rows) => (find(rows, 'messageType', orders.messageType).Validation = 'XML'),
};

function assess(edit: keyof typeof edits): BrokerSetupAssessment {
  const rows = healthyRows(options);
  edits[edit]!(rows);
  return assessBrokerSetup(parseBrokerObservation(rows), options);
}

describe('assessBrokerSetup', () => {
  it('finds nothing wrong where the setup ran', () => {
    expect(assess('healthy')).toEqual({ database: 'appdb', brokerEnabled: true, missing: [], problems: [] });
  });

  it.each([
    ['brokerOff', [], ['broker-disabled']],
    ['queueMissing', ['queue [sqlqueue].[orders_TargetQueue]'], []],
    ['notificationMissing', ['event notification [sqlqueue_activation] on queue [sqlqueue].[orders_TargetQueue]'], []],
    ['queueDisabled', [], ['queue-disabled']],
    ['internalActivation', [], ['internal-activation']],
    ['poisonOn', [], ['poison-handling-on']],
    ['serviceElsewhere', [], ['service-queue']],
    ['serviceWithoutContract', [], ['service-contract']],
    ['notificationMisdirected', [], ['notification-target']],
    ['xmlTypeOnJson', [], ['message-type-validation']],
  ] as const)('%s', (edit, missing, kinds) => {
    const a = assess(edit);
    expect(a.missing).toEqual(missing);
    expect(a.problems.map((p) => p.kind)).toEqual(kinds);
  });

  it('names the fix: the ALTER DATABASE for a disabled broker, the ALTER QUEUE for a disabled queue', () => {
    expect(assess('brokerOff').problems[0]).toMatchObject({
      message: "Service Broker is disabled in database 'appdb'",
      fix: expect.stringMatching(
        /^run ALTER DATABASE \[appdb\] SET ENABLE_BROKER WITH ROLLBACK IMMEDIATE \(needs exclusive access.*\), or set broker\.enableBroker: true with broker\.setup 'auto'$/,
      ),
    });
    expect(assess('queueDisabled').problems[0]).toMatchObject({
      fix: 'run ALTER QUEUE [sqlqueue].[orders_TargetQueue] WITH STATUS = ON;',
      repair: 'ALTER QUEUE [sqlqueue].[orders_TargetQueue] WITH STATUS = ON;',
    });
    expect(assess('notificationMisdirected').problems[0]!.repair).toBe(brokerEventNotificationBatch(orders, options));
    expect(assess('internalActivation').problems[0]!.repair).toBeUndefined();
  });

  it('reads a broker that cannot see anything as everything missing', () => {
    const rows = healthyRows(options).map((r) => (r.Kind === 'database' ? r : { ...r, Present: false }));
    const a = assessBrokerSetup(parseBrokerObservation(rows), options);
    expect(a.missing).toContain('message type [nestjs-sql-queue/sqlqueue/orders/message]');
    expect(a.missing).toContain('contract [nestjs-sql-queue/sqlqueue/orders/contract]');
    expect(a.missing).toContain('service [nestjs-sql-queue/sqlqueue/activation]');
    expect(a.missing.some((m) => m.startsWith('event notification'))).toBe(false);
  });
});

describe('brokerBootDecision', () => {
  const withMode = (setup: 'auto' | 'print' | 'off', enableBroker = false) => ({ ...options, setup, enableBroker });

  it.each([
    ['healthy', 'auto', 'ok'],
    ['healthy', 'off', 'ok'],
    ['poisonOn', 'off', 'ok'],
    ['queueMissing', 'auto', 'setup'],
    ['queueMissing', 'print', 'fail'],
    ['queueMissing', 'off', 'fail'],
    ['brokerOff', 'auto', 'fail'],
    ['brokerOff', 'print', 'fail'],
    ['queueDisabled', 'auto', 'setup'],
    ['queueDisabled', 'print', 'fail'],
    ['queueDisabled', 'off', 'fail'],
    ['notificationMisdirected', 'auto', 'setup'],
    ['internalActivation', 'auto', 'fail'],
    ['serviceElsewhere', 'auto', 'fail'],
    ['serviceWithoutContract', 'auto', 'fail'],
    ['xmlTypeOnJson', 'auto', 'fail'],
  ] as const)('%s with setup %s: %s', (edit, setup, action) => {
    expect(brokerBootDecision(assess(edit), withMode(setup)).action).toBe(action);
  });

  it("'auto' creates what is missing with the whole idempotent setup", () => {
    const d = brokerBootDecision(assess('queueMissing'), withMode('auto'));
    expect(d).toEqual({ action: 'setup', enableBroker: false, batches: brokerSetupBatches(options), warnings: [] });
  });

  it("'auto' re-enables a disabled queue and says so", () => {
    const d = brokerBootDecision(assess('queueDisabled'), withMode('auto'));
    expect(d).toMatchObject({
      action: 'setup',
      enableBroker: false,
      batches: ['ALTER QUEUE [sqlqueue].[orders_TargetQueue] WITH STATUS = ON;'],
    });
    expect(d.warnings).toEqual([
      expect.stringMatching(
        /^queue \[sqlqueue\]\.\[orders_TargetQueue\] is disabled .*: running ALTER QUEUE \[sqlqueue\]\.\[orders_TargetQueue\] WITH STATUS = ON;$/,
      ),
    ]);
  });

  it("enables a disabled broker only with 'auto' and enableBroker", () => {
    expect(brokerBootDecision(assess('brokerOff'), withMode('auto', true))).toMatchObject({
      action: 'setup',
      enableBroker: true,
      batches: [],
    });
    const d = brokerBootDecision(assess('brokerOff'), withMode('auto'));
    expect(d.action === 'fail' && d.message).toMatch(
      /Service Broker is disabled in database 'appdb': run ALTER DATABASE \[appdb\] SET ENABLE_BROKER WITH ROLLBACK IMMEDIATE/,
    );
    expect(brokerBootDecision(assess('brokerOff'), withMode('off', true)).action).toBe('fail');
  });

  it("'print' fails with the setup script; 'off' fails naming what is missing and how to create it", () => {
    const print = brokerBootDecision(assess('queueMissing'), withMode('print'));
    expect(print).toMatchObject({ action: 'fail', script: brokerSetupScript(options) });
    const off = brokerBootDecision(assess('queueMissing'), withMode('off'));
    expect(off).toMatchObject({ action: 'fail', script: null });
    expect(off.action === 'fail' && off.message).toMatch(
      /^Service Broker setup is incomplete in database 'appdb': missing: queue \[sqlqueue\]\.\[orders_TargetQueue\] \(broker\.setup is 'off': have a DBA run the script from `nestjs-sql-queue sql --dialect mssql --schema sqlqueue --broker-only/,
    );
    const disabled = brokerBootDecision(assess('queueDisabled'), withMode('off'));
    expect(disabled.action === 'fail' && disabled.message).toContain(
      'run ALTER QUEUE [sqlqueue].[orders_TargetQueue] WITH STATUS = ON;',
    );
  });

  it('keeps warnings apart from failures', () => {
    expect(brokerBootDecision(assess('poisonOn'), withMode('auto'))).toEqual({
      action: 'ok',
      warnings: [
        expect.stringMatching(
          /POISON_MESSAGE_HANDLING \(STATUS = ON\): five rolled-back receives by any session.*WITH POISON_MESSAGE_HANDLING \(STATUS = OFF\);$/,
        ),
      ],
    });
  });

  it('fails instead of running the setup again on the second pass', () => {
    const d = brokerBootDecision(assess('queueMissing'), withMode('auto'), true);
    expect(d.action === 'fail' && d.message).toMatch(
      /^Service Broker setup did not complete in database 'appdb': missing: queue/,
    );
  });
});

describe('applyBrokerSetup', () => {
  function fakeDriver(failOn?: string) {
    const log: string[] = [];
    const session: BrokerSession = {
      query: async (text) => {
        log.push(`session: ${text.split('\n')[0]}`);
        if (failOn && text.includes(failOn)) throw new Error('boom');
        return [];
      },
      cancel: () => undefined,
      commit: async () => void log.push('commit'),
      rollback: async () => void log.push('rollback'),
    };
    const driver = {
      query: async (text: string) => (log.push(`autocommit: ${text}`), []),
      begin: async () => (log.push('begin'), session),
    } as unknown as BrokerDriver;
    return { driver, log };
  }

  it('enables the broker on its own, then runs the batches in one transaction under the migration lock', async () => {
    const { driver, log } = fakeDriver();
    await applyBrokerSetup(driver, options, { enableBroker: true, batches: ['SELECT 1;', 'SELECT 2;'] });
    expect(log).toEqual([
      `autocommit: ${brokerEnableStatement()}`,
      'begin',
      'session: DECLARE @result int;',
      'session: SELECT 1;',
      'session: SELECT 2;',
      'commit',
    ]);
    expect(brokerSetupLock('SqlQueue').params).toEqual({
      resource: { type: 'nvarchar', value: 'nestjs-sql-queue:migrate:sqlqueue' },
      timeoutMs: { type: 'int', value: 60_000 },
    });
  });

  it('rolls back and rethrows when a batch fails', async () => {
    const { driver, log } = fakeDriver('SELECT 2');
    await expect(
      applyBrokerSetup(driver, options, { enableBroker: false, batches: ['SELECT 1;', 'SELECT 2;'] }),
    ).rejects.toThrow('boom');
    expect(log.at(-1)).toBe('rollback');
    expect(log).not.toContain('commit');
  });
});
