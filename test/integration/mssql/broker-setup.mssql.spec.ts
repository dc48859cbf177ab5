/**
 * Service Broker setup and permissions (issue 12; research B (ii) 10 and 13), against the
 * database with READ_COMMITTED_SNAPSHOT off and, for the broker-off case, sqlqueue_nobroker
 * (create-databases.sql creates it with DISABLE_BROKER; SQLQUEUE_MSSQL_NOBROKER_URL overrides the
 * URL, which is otherwise SQLQUEUE_MSSQL_URL with that database):
 * - a database with Service Broker off: the boot fails naming ENABLE_BROKER with setup 'off' and
 *   'auto' (enableBroker left false), and logs the setup script with 'print';
 * - a login holding only the grants of brokerGrantsScript (readers and senders) boots with setup
 *   'off', consumes, sends and reads health.
 */
import { randomBytes } from 'node:crypto';
import { afterAll, expect, it } from 'vitest';
import { brokerGrantsScript, brokerTeardownBatches } from '../../../lib/src/broker/broker.setup.js';
import {
  BROKER_ENABLED,
  CAN_CREATE_LOGINS,
  createTestLogin,
  createTestUser,
  dropTestLogin,
  dropTestUser,
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

    it('a login holding only the brokerGrantsScript grants consumes and sends with setup off', async (context) => {
      const [can] = await mssqlRows<{ Granted: number }>(db.url, CAN_CREATE_LOGINS);
      if (can?.Granted !== 1) context.skip('the test login may not create logins (ALTER ANY LOGIN)');
      const name = 'leastpriv';
      // The owner (the suite's login) migrates the schema and creates the broker objects.
      const owner = await suite.boot({ queues: { [name]: {} }, module: { consumer: { enabled: false } }, keep: true });
      await owner.close();

      const login = `sqlqueue_lp_${randomBytes(4).toString('hex')}`;
      const password = `${randomBytes(12).toString('hex')}Aa1!`;
      await mssqlRows(db.url, createTestLogin(login, password));
      try {
        await mssqlRows(db.url, createTestUser(login, suite.schema));
        const grants = brokerGrantsScript(suite.resolved({ queues: { [name]: {} } }), {
          readers: login,
          senders: login,
        });
        await withMssqlPool(db.url, async (pool) => {
          for (const batch of grants.split(/^GO$/m).filter((b) => b.replace(/--.*$/gm, '').trim() !== '')) {
            await pool.request().batch(batch);
          }
        });

        const log = new CallLog<{ n: number }>();
        const app = await suite.boot({
          url: urlAs(db.url, login, password),
          queues: { [name]: {} },
          broker: { setup: 'off' },
          module: { migrations: 'off' },
          handlers: { [name]: log.handler() },
          keep: true,
        });
        try {
          await app.producer.send(name, { n: 1 }, { groupKey: 'lp' });
          await app.producer.send(name, { n: 2 });
          await waitFor(
            () => log.calls.length,
            (n) => n === 2,
            { what: 'both messages, as the least-privilege login' },
          );
          expect((await app.health(name)).status).toBe('up');
          expect(log.handledNs()).toEqual([1, 2]);
        } finally {
          await app.close();
        }
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
