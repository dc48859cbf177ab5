/**
 * Service Broker setup and permissions (issue 12; research B (ii) 10 and 13; review 2, R2-4 and
 * R2-10), against the database with READ_COMMITTED_SNAPSHOT off and, for the broker-off case,
 * sqlqueue_nobroker (create-databases.sql creates it with DISABLE_BROKER;
 * SQLQUEUE_MSSQL_NOBROKER_URL overrides the URL, which is otherwise SQLQUEUE_MSSQL_URL with that
 * database):
 * - a database with Service Broker off: the boot fails naming ENABLE_BROKER with setup 'off' and
 *   'auto' (enableBroker left false), and logs the setup script with 'print';
 * - setup 'auto' creates every queue (target, initiator, notification, doorbell) with
 *   POISON_MESSAGE_HANDLING OFF; a target queue that already exists with it ON is left as it is,
 *   with the 'poison-handling-on' warning naming the fix, and the fix silences it;
 * - a login holding only the grants of brokerGrantsScript (readers and senders, the table queue's
 *   runtime grants included) boots with setup 'off' and the doorbell, consumes, sends, rings the
 *   doorbell for a table-queue job and reads health, with no error and no permission problem in
 *   its log (the listener's poll and the doorbell's pending check only log their failures).
 */
import { randomBytes } from 'node:crypto';
import { afterAll, expect, it } from 'vitest';
import { quoteBrokerObject } from '../../../lib/src/broker/broker.names.js';
import { brokerGrantsScript, brokerTeardownBatches } from '../../../lib/src/broker/setup/broker.setup.js';
import sql from 'mssql';
import {
  BROKER_ENABLED,
  CAN_CREATE_LOGINS,
  createQueueWithPoisonHandling,
  createTestLogin,
  createTestUser,
  disablePoisonHandling,
  doorbellNamePrefix,
  DROP_SCHEMA_IF_EXISTS,
  dropTestLogin,
  dropTestUser,
  ENDPOINTS_BY_STATE,
  ENSURE_SCHEMA,
} from '../../helpers/broker-test-queries.js';
import { CaptureLogger } from '../../helpers/capture-logger.js';
import { dropMssqlSchema, mssqlRows, withMssqlPool } from '../../helpers/mssql.js';
import { waitFor } from '../../helpers/wait-for.js';
import { brokerSuite, CallLog } from './broker-harness.js';
import { describeEachMssqlDatabase } from './mssql-databases.js';

const NOBROKER_DATABASE = 'sqlqueue_nobroker';

/** The URL of the database with Service Broker off: the given one, or `url` with its database swapped. */
function nobrokerUrl(url: string): string {
  if (process.env.SQLQUEUE_MSSQL_NOBROKER_URL) return process.env.SQLQUEUE_MSSQL_NOBROKER_URL;
  const parsed = new URL(url);
  parsed.pathname = `/${NOBROKER_DATABASE}`;
  return parsed.toString();
}

/** `url` logging in as another SQL login. */
function urlAs(url: string, login: string, password: string): string {
  const parsed = new URL(url);
  parsed.username = login;
  parsed.password = password;
  return parsed.toString();
}

describeEachMssqlDatabase(
  'Service Broker: setup checks and least privilege',
  (db) => {
    /** A schema of the least-privilege test's target queue, apart from the module schema. */
    let queueSchema: string | null = null;
    // Registered before the suite's hooks, so it runs after them (hooks run as a stack): the
    // suite's teardown has dropped the queue in it by then.
    afterAll(async () => {
      if (queueSchema) {
        await mssqlRows(db.url, DROP_SCHEMA_IF_EXISTS, (r) => r.input('schema', sql.NVarChar(128), queueSchema));
      }
    });
    const suite = brokerSuite(db, 'brkset');
    const offUrl = nobrokerUrl(db.url);

    afterAll(async () => {
      // The boots against the broker-off database migrated the schema there, and created nothing else.
      await withMssqlPool(offUrl, async (pool) => {
        for (const batch of brokerTeardownBatches(suite.resolved({ queues: { off: {} } }))) {
          await pool.request().batch(batch);
        }
      }).catch(() => undefined);
      await dropMssqlSchema(offUrl, suite.schema).catch(() => undefined);
    });

    for (const setup of ['off', 'auto', 'print'] as const) {
      it(`Service Broker off in the database: setup '${setup}' fails the boot naming ENABLE_BROKER`, async () => {
        const [state] = await mssqlRows<{ Database: string; BrokerEnabled: number }>(offUrl, BROKER_ENABLED).catch(
          (error: Error) => {
            throw new Error(
              `cannot open the broker-off database (${error.message}): run test/integration/mssql/create-databases.sql, or set SQLQUEUE_MSSQL_NOBROKER_URL`,
            );
          },
        );
        expect(state, `${state?.Database} must have Service Broker off (create-databases.sql)`).toMatchObject({
          BrokerEnabled: 0,
        });
        const logger = new CaptureLogger();
        const failure = await suite
          .boot({
            url: offUrl,
            queues: { off: {} },
            broker: { setup },
            handlers: { off: () => Promise.resolve() },
            logger,
          })
          .then(
            () => undefined,
            (error: unknown) => error as Error,
          );
        expect(failure, 'the boot must fail').toBeInstanceOf(Error);
        expect(failure!.message).toMatch(/Service Broker/);
        expect(failure!.message).toMatch(/ENABLE_BROKER/);
        if (setup === 'print') {
          // The setup script, for a DBA; it names ENABLE_BROKER, which needs exclusive access.
          const logged = logger.lines.map((line) => line.message).join('\n');
          expect(`${failure!.message}\n${logged}`).toContain('CREATE QUEUE');
        }
      });
    }

    it("setup 'auto' creates every queue with POISON_MESSAGE_HANDLING OFF", async () => {
      const name = 'created';
      await suite.boot({
        queues: { [name]: {} },
        broker: { doorbell: true },
        handlers: { [name]: () => Promise.resolve() },
      });
      const options = suite.resolved({ queues: { [name]: {} }, doorbell: true });
      const queues = [
        options.queues[0]!.queue,
        options.queues[0]!.initiatorQueue,
        options.notificationQueue,
        options.doorbell!.queue,
        options.doorbell!.initiatorQueue,
      ];
      for (const queue of queues) {
        expect(await suite.queueStatus(queue), `${queue.schema}.${queue.name}`).toEqual({
          ReceiveEnabled: 1,
          EnqueueEnabled: 1,
          PoisonHandling: 0,
        });
      }
    });

    it("a target queue that exists with POISON_MESSAGE_HANDLING ON: the boot warns 'poison-handling-on' naming the fix, leaves the queue as it is and consumes it; the fix silences the warning", async () => {
      const name = 'poisonon';
      const queue = suite.queue(name).queue;
      await mssqlRows(db.url, ENSURE_SCHEMA, (r) => r.input('schema', sql.NVarChar(128), suite.schema));
      await mssqlRows(db.url, createQueueWithPoisonHandling(queue));
      expect(await suite.queueStatus(queue)).toMatchObject({ PoisonHandling: 1 });
      const fix = disablePoisonHandling(queue);
      const warningsOf = (logger: CaptureLogger) =>
        logger.lines.filter((line) => line.level === 'warn' && line.message.includes('POISON_MESSAGE_HANDLING'));

      const log = new CallLog<{ n: number }>();
      const logger = new CaptureLogger();
      const app = await suite.boot({ queues: { [name]: {} }, handlers: { [name]: log.handler() }, logger, keep: true });
      try {
        const warnings = warningsOf(logger);
        // Seen before the setup run and again after it (broker.runtime checkBrokerSetup), logged once.
        expect(warnings.length, logger.lines.map((l) => `[${l.level}] ${l.message}`).join('\n')).toBe(1);
        expect(warnings[0]!.message).toContain('POISON_MESSAGE_HANDLING (STATUS = ON)');
        expect(warnings[0]!.message).toContain(`queue ${quoteBrokerObject(queue)} has POISON_MESSAGE_HANDLING`);
        expect(warnings[0]!.message, 'the warning names the fix').toContain(fix);
        // A warning, not a repair: the queue keeps its setting, and is consumed.
        expect(await suite.queueStatus(queue)).toEqual({ ReceiveEnabled: 1, EnqueueEnabled: 1, PoisonHandling: 1 });
        await app.producer.send(name, { n: 1 }, { groupKey: 'on' });
        await waitFor(
          () => log.calls.length,
          (n) => n === 1,
          { what: 'the message on the pre-existing queue' },
        );
      } finally {
        await app.close();
      }

      await mssqlRows(db.url, fix);
      expect(await suite.queueStatus(queue)).toMatchObject({ PoisonHandling: 0 });
      const quiet = new CaptureLogger();
      await suite.boot({ queues: { [name]: {} }, handlers: { [name]: log.handler() }, logger: quiet });
      expect(warningsOf(quiet)).toEqual([]);
    });

    it('a login holding only the brokerGrantsScript grants consumes, sends and rings the doorbell with setup off, logging no error and no permission problem', async (context) => {
      const [can] = await mssqlRows<{ Granted: number }>(db.url, CAN_CREATE_LOGINS);
      if (can?.Granted !== 1) context.skip('the test login may not create logins (ALTER ANY LOGIN)');
      const name = 'leastpriv';
      // The target queue in a schema of its own: the runtime grants give SELECT on the module
      // schema, which would cover the listener's poll (SELECT … FROM queue WITH (NOLOCK)) of a
      // queue there; here only RECEIVE on the queue can (the assumption brokerGrantsScript makes).
      queueSchema = `${suite.schema}q`;
      const queues = { [name]: { queue: `${queueSchema}.LeastPrivQueue` } };
      /** A table queue of the same application: its enqueue rings the doorbell. */
      const jobs = 'lp-jobs';
      // The owner (the suite's login) migrates the schema and creates the broker objects, the doorbell's too.
      const owner = await suite.boot({
        queues,
        broker: { doorbell: true },
        module: { consumer: { enabled: false } },
        keep: true,
      });
      await owner.close();
      const options = suite.resolved({ queues, doorbell: true });
      expect(options.queues[0]!.queue).toEqual({ schema: queueSchema, name: 'LeastPrivQueue' });

      const login = `sqlqueue_lp_${randomBytes(4).toString('hex')}`;
      const password = `${randomBytes(12).toString('hex')}Aa1!`;
      await mssqlRows(db.url, createTestLogin(login, password));
      try {
        await mssqlRows(db.url, createTestUser(login, suite.schema));
        const grants = brokerGrantsScript(options, { readers: login, senders: login });
        expect(grants, 'the grants include the table queue runtime grants (mssqlRuntimeGrants)').toMatch(
          /GRANT EXECUTE ON TYPE::/,
        );
        await withMssqlPool(db.url, async (pool) => {
          for (const batch of grants.split(/^GO$/m).filter((b) => b.replace(/--.*$/gm, '').trim() !== '')) {
            await pool.request().batch(batch);
          }
        });

        const log = new CallLog<{ n: number }>();
        const handledJobs = new CallLog<{ n: number }>();
        const logger = new CaptureLogger();
        const app = await suite.boot({
          url: urlAs(db.url, login, password),
          queues,
          broker: { setup: 'off', doorbell: true },
          module: { migrations: 'off' },
          handlers: { [name]: log.handler(), [jobs]: handledJobs.handler() },
          logger,
          keep: true,
        });
        let lines: { level: string; message: string }[];
        try {
          await app.producer.send(name, { n: 1 }, { groupKey: 'lp' });
          await app.producer.send(name, { n: 2 });
          await waitFor(
            () => log.calls.length,
            (n) => n === 2,
            { what: 'both messages, as the least-privilege login' },
          );
          expect(log.handledNs()).toEqual([1, 2]);
          // A table-queue job: its enqueue rings the doorbell (the pending check reads the doorbell
          // queue, then a send), and this process's doorbell listener receives the ring.
          await app.producer.enqueue(jobs, { n: 1 });
          await waitFor(
            () => handledJobs.calls.length,
            (n) => n === 1,
            { what: 'the table-queue job, as the least-privilege login' },
          );
          const doorbellEndpoints = async () =>
            (
              await mssqlRows<{ Endpoints: number }>(db.url, ENDPOINTS_BY_STATE, (r) =>
                r.input('prefix', sql.NVarChar(256), doorbellNamePrefix(suite.schema)),
              )
            ).reduce((sum, row) => sum + Number(row.Endpoints), 0);
          await waitFor(
            async () => ({
              endpoints: await doorbellEndpoints(),
              waiting: await suite.messagesIn(options.doorbell!.queue),
            }),
            (seen) => seen.endpoints > 0 && seen.waiting === 0,
            { what: 'a ring sent on a doorbell dialog and received by the listener' },
          );
          const health = await app.health(name);
          expect(health.status, JSON.stringify(health)).toBe('up');
          // Without VIEW SERVER STATE the lock reading says so, and is no problem of the queue's.
          expect(health.locks).toMatchObject({ readable: false, reason: expect.stringMatching(/denied/i) });
          // Some polls of the activation listener and rounds of the doorbell listener ran meanwhile.
          lines = [...logger.lines];
        } finally {
          await app.close();
        }
        const shown = (found: { level: string; message: string }[]) => found.map((l) => `[${l.level}] ${l.message}`);
        // R2-10: a failing poll or pending check only logs, so the log is where a missing grant shows.
        expect(
          shown(lines.filter((line) => line.level === 'error')),
          'errors logged as the least-privilege login',
        ).toEqual([]);
        expect(
          shown(lines.filter((line) => /permission|denied/i.test(line.message))),
          'permission problems logged as the least-privilege login',
        ).toEqual([]);
        expect(
          shown(
            lines.filter((line) =>
              /polling broker queues|receiving activation events|Service Broker doorbell:|wake-up notification .* failed|reading broker queue/i.test(
                line.message,
              ),
            ),
          ),
          'failures of the poll, the doorbell or a receiver (some are logged below error level)',
        ).toEqual([]);
      } finally {
        await mssqlRows(db.url, dropTestUser(login));
        // DROP LOGIN fails (15434) while a session of the login is still being closed.
        await waitFor(
          () =>
            mssqlRows(db.url, dropTestLogin(login)).then(
              () => true,
              () => false,
            ),
          Boolean,
          { what: `login ${login} dropped` },
        );
      }
    });
  },
  (db) => db.label === 'RCSI off',
);
