import { describe, expect, it } from 'vitest';
import { SqlQueueConfigError, SqlQueueValidationError } from '../../lib/src/core/errors.js';
import {
  assertScheduleId,
  parseScheduleJobKey,
  scheduleJobKey,
  toScheduleRecord,
  toScheduleUpsert,
  validateScheduleDefinition,
} from '../../lib/src/core/schedules/schedule-options.js';
import type { ScheduleDefinition, ScheduleRow } from '../../lib/src/core/schedules/schedule.types.js';

const LIMIT = 1024;
const valid = (def: unknown, id: unknown = 'report.daily', error?: typeof SqlQueueConfigError) =>
  validateScheduleDefinition(id, def as ScheduleDefinition, LIMIT, error);

describe('schedule ids', () => {
  it.each(['a', 'report.daily', 'A-b_c.9', 'x'.repeat(128)])('takes %j', (id) => {
    expect(assertScheduleId(id)).toBe(id);
  });
  it.each(['', 'x'.repeat(129), 'a b', 'a:b', "o'brien", 'ä', 5, null])('refuses %j, naming the rule', (id) => {
    expect(() => assertScheduleId(id)).toThrow(SqlQueueValidationError);
    expect(() => assertScheduleId(id)).toThrow(/schedule id .* is invalid: use letters, digits/);
  });
});

describe('validateScheduleDefinition', () => {
  it('fills in the defaults: UTC, payload null, no options, catchUp last', () => {
    expect(valid({ cron: '0 * * * *', queue: 'reports' })).toEqual({
      cron: '0 * * * *',
      timezone: 'UTC',
      queue: 'reports',
      payload: 'null',
      options: {},
      catchUp: 'last',
    });
  });

  it('keeps what is given', () => {
    expect(
      valid({
        cron: '0 30 2 * * *',
        timezone: 'Europe/Stockholm',
        queue: 'reports',
        payload: { kind: 'daily' },
        options: { priority: 5, maxAttempts: 3, groupKey: 'tenant-1' },
        catchUp: 'all',
      }),
    ).toEqual({
      cron: '0 30 2 * * *',
      timezone: 'Europe/Stockholm',
      queue: 'reports',
      payload: '{"kind":"daily"}',
      options: { priority: 5, maxAttempts: 3, groupKey: 'tenant-1' },
      catchUp: 'all',
    });
  });

  it.each([
    [{ cron: '0 * * * *', queue: 'q', catchup: 'all' }, /unknown option 'catchup' \(did you mean 'catchUp'\?\)/],
    [{ cron: '0 * * * *', queue: 'q', timeZone: 'UTC' }, /unknown option 'timeZone' \(did you mean 'timezone'\?\)/],
    [
      { cron: '0 * * * *', queue: 'q', options: { maxAttempt: 3 } },
      /options: unknown option 'maxAttempt' \(did you mean 'maxAttempts'\?\)/,
    ],
    [
      { cron: '0 * * * *', queue: 'q', options: { delayMs: 3 } },
      /unknown option 'delayMs'.*valid options: priority, maxAttempts, groupKey/,
    ],
    [{ cron: '0 * * * *' }, /queue is required/],
    [{ cron: '0 * * * *', queue: 'bad queue' }, /queue name 'bad queue' is invalid/],
    [{ queue: 'q' }, /cron must be a non-empty string/],
    [{ cron: '99 * * * *', queue: 'q' }, /cron expression '99 \* \* \* \*' is invalid/],
    [
      { cron: '0 * * * *', queue: 'q', timezone: 'Europe/Stokholm' },
      /timezone 'Europe\/Stokholm' is not a known IANA time zone/,
    ],
    [{ cron: '0 * * * *', queue: 'q', catchUp: 'some' }, /catchUp must be 'none', 'last' or 'all', got 'some'/],
    [{ cron: '0 * * * *', queue: 'q', payload: () => 1 }, /payload is not JSON-serializable/],
    [{ cron: '0 * * * *', queue: 'q', payload: 'x'.repeat(2000) }, /over the limit of 1024/],
    [{ cron: '0 * * * *', queue: 'q', options: { priority: 1.5 } }, /priority must be an integer/],
    [{ cron: '0 * * * *', queue: 'q', options: { maxAttempts: 0 } }, /maxAttempts must be an integer from 1/],
    [{ cron: '0 * * * *', queue: 'q', options: { groupKey: 'g ' } }, /groupKey must not end with whitespace/],
    ['0 * * * *', /must be an object/],
  ])('refuses %j, naming the schedule and the problem', (def, message) => {
    expect(() => valid(def)).toThrow(SqlQueueValidationError);
    expect(() => valid(def)).toThrow(message);
    expect(() => valid(def)).toThrow(/schedule 'report\.daily'/);
  });

  it('raises config errors for the module option', () => {
    expect(() => valid({ cron: 'x', queue: 'q' }, 'a', SqlQueueConfigError)).toThrow(SqlQueueConfigError);
    expect(() => valid({ cron: '0 * * * *', queue: 'q', payload: 10n }, 'a', SqlQueueConfigError)).toThrow(
      SqlQueueConfigError,
    );
    expect(() => valid({ cron: '0 * * * *', queue: 'q' }, 'a b', SqlQueueConfigError)).toThrow(SqlQueueConfigError);
  });
});

describe('toScheduleUpsert', () => {
  it('serializes and sets the first tick after the database now', () => {
    const now = new Date('2026-05-01T10:15:00.123Z');
    expect(
      toScheduleUpsert(
        'hourly',
        { cron: '0 * * * *', queue: 'q', payload: [1], options: { groupKey: 'g' } },
        'options',
        now,
        LIMIT,
      ),
    ).toEqual({
      id: 'hourly',
      queue: 'q',
      cron: '0 * * * *',
      timezone: 'UTC',
      payload: '[1]',
      options: '{"groupKey":"g"}',
      catchUp: 'last',
      source: 'options',
      nextRunAt: new Date('2026-05-01T11:00:00.000Z'),
    });
  });
});

describe('toScheduleRecord', () => {
  it('parses the JSON columns', () => {
    const t = new Date('2026-05-01T10:00:00Z');
    const row: ScheduleRow = {
      id: 's',
      queue: 'q',
      cron: '* * * * *',
      timezone: 'UTC',
      payload: '{"a":1}',
      options: '{"priority":2}',
      catchUp: 'none',
      paused: true,
      source: 'api',
      nextRunAt: null,
      lastRunAt: t,
      lastTick: t,
      createdAt: t,
      updatedAt: t,
    };
    expect(toScheduleRecord(row)).toEqual({ ...row, payload: { a: 1 }, options: { priority: 2 } });
  });
});

describe('schedule job keys', () => {
  it('formats schedule:<id>:<tick ISO with ms> and parses it back', () => {
    const tick = new Date('2026-12-01T02:30:00.000Z');
    const key = scheduleJobKey('report.daily', tick);
    expect(key).toBe('schedule:report.daily:2026-12-01T02:30:00.000Z');
    expect(parseScheduleJobKey(key)).toEqual({ id: 'report.daily', tick });
  });

  it.each([
    null,
    undefined,
    'order-42',
    'schedule:',
    'schedule:a b:2026-12-01T02:30:00.000Z',
    'schedule:x:2026-12-01T02:30:00Z',
    'schedule:x:2026-02-30T02:30:00.000Z',
    'schedule:x:2026-12-01T02:30:00.000Z:extra',
  ])('is null for any other key: %j', (key) => {
    expect(parseScheduleJobKey(key)).toBeNull();
  });
});
