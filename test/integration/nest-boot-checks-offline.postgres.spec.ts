import { Injectable, Module, Scope } from '@nestjs/common';
import { beforeAll, describe, expect, it } from 'vitest';
import { QueueHandler, SqlQueueConfigError, SqlQueueModule, type SqlQueueModuleOptions } from '../../lib/src/index.js';
import { freePort } from '../helpers/private-postgres.js';
import { createQueueApp, type QueueAppOptions } from '../helpers/queue-app.js';

// Issue 9 (friction in a fresh app). Before the fix, handlers were discovered and checked only
// at module init, after the runtime's factory had connected and migrated: with the database
// down, two handlers for one queue (or a bad option) were reported as "connect ECONNREFUSED".
// Every check that needs no database now runs first (and the decorator checks what it can when
// the class is defined). No database is reachable in this file: the URL points at a closed port.

let closedPortUrl: string;
beforeAll(async () => {
  // A port that was free a moment ago: nothing listens there, so connecting is refused at once.
  closedPortUrl = `postgres://postgres@127.0.0.1:${await freePort()}/test`;
});

function bootOffline(options: Omit<QueueAppOptions, 'schema'> & { module?: Partial<SqlQueueModuleOptions> }) {
  return createQueueApp({
    schema: 'unused',
    queueModule: SqlQueueModule.forRoot({
      connection: { dialect: 'postgres', url: closedPortUrl, poolSize: 1 },
      schema: 'offline',
      ...options.module,
    }),
    ...options,
  });
}

describe('with the database unreachable, boot reports the bad handler, not the connection', () => {
  it('the control: a good setup fails on the connection', async () => {
    @QueueHandler('offline.good')
    class GoodHandler {
      async handle() {}
    }
    await expect(bootOffline({ providers: [GoodHandler] })).rejects.toThrow(/ECONNREFUSED/);
  });

  it('two handlers for one queue', async () => {
    @QueueHandler('offline.dup')
    class FirstHandler {
      async handle() {}
    }
    @QueueHandler('offline.dup')
    class SecondHandler {
      async handle() {}
    }
    @Module({ providers: [SecondHandler] })
    class Feature {}
    await expect(bootOffline({ providers: [FirstHandler], imports: [Feature] })).rejects.toThrow(
      /queue 'offline\.dup' has two handlers, FirstHandler and SecondHandler/,
    );
  });

  it('handler options that contradict the module queues entry', async () => {
    @QueueHandler('offline.minmax', { maxReaders: 2 })
    class MinMaxHandler {
      async handle() {}
    }
    await expect(
      bootOffline({ providers: [MinMaxHandler], module: { queues: { 'offline.minmax': { minReaders: 3 } } } }),
    ).rejects.toThrow(
      /@QueueHandler\('offline\.minmax'\) on MinMaxHandler: minReaders \(3\) is greater than maxReaders \(2\)/,
    );
  });

  it('a request-scoped handler', async () => {
    @QueueHandler('offline.scoped')
    @Injectable({ scope: Scope.REQUEST })
    class ScopedHandler {
      async handle() {}
    }
    await expect(bootOffline({ providers: [ScopedHandler] })).rejects.toThrow(
      /ScopedHandler: handlers must be singleton providers/,
    );
  });

  it('a handler provided with useClass, in two modules', async () => {
    @QueueHandler('offline.twice')
    class BaseHandler {
      async handle() {}
    }
    class SubHandler extends BaseHandler {}
    @Module({ providers: [{ provide: 'first', useClass: SubHandler }] })
    class First {}
    @Module({ providers: [{ provide: 'second', useClass: SubHandler }] })
    class Second {}
    await expect(bootOffline({ imports: [First, Second] })).rejects.toThrow(
      /queue 'offline\.twice' has two handlers: SubHandler is provided in two modules/,
    );
  });

  it('a second SqlQueueModule and a missing ScheduleModule', async () => {
    @Module({
      imports: [
        SqlQueueModule.forRoot({ connection: { dialect: 'postgres', url: closedPortUrl }, schema: 'offline2' }),
      ],
    })
    class FeatureWithItsOwnQueue {}
    await expect(bootOffline({ imports: [FeatureWithItsOwnQueue] })).rejects.toThrow(/imported more than once/);
    await expect(bootOffline({ withSchedule: false })).rejects.toThrow(/import ScheduleModule\.forRoot\(\)/);
  });
});

describe('@QueueHandler checks what it says when the class is defined', () => {
  it('an invalid queue name', () => {
    const define = () => {
      @QueueHandler('emails queue')
      class SpacedHandler {
        async handle() {}
      }
      return SpacedHandler;
    };
    expect(define).toThrow(SqlQueueConfigError);
    expect(define).toThrow(/@QueueHandler\('emails queue'\) on SpacedHandler: queue name 'emails queue' is invalid/);
  });

  it('invalid and unknown options', () => {
    expect(() => {
      @QueueHandler('offline.opts', { maxReaders: 0 })
      class ZeroReaders {
        async handle() {}
      }
      return ZeroReaders;
    }).toThrow(/@QueueHandler\('offline\.opts'\) on ZeroReaders\.maxReaders must be an integer from 1/);
    expect(() => {
      @QueueHandler('offline.opts', { maxReader: 3 } as never)
      class Misspelt {
        async handle() {}
      }
      return Misspelt;
    }).toThrow(/on Misspelt: unknown option 'maxReader' \(did you mean 'maxReaders'\?\)/);
  });
});
