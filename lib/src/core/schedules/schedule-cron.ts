import { CronTime } from 'cron';
import { SqlQueueValidationError } from '../errors.js';
import { describe } from '../validation.js';

/** The zone a schedule's expression is read in when none is given. */
export const DEFAULT_SCHEDULE_TIMEZONE = 'UTC';

/** Longest cron expression and zone name taken (both are stored as short text). */
export const CRON_MAX_LENGTH = 255;
export const TIMEZONE_MAX_LENGTH = 64;

type ErrorClass = new (message: string) => Error;

/**
 * Checks a cron expression and its IANA time zone, or throws naming both and what is wrong.
 * The expression has 5 fields (minute first) or 6 (seconds first), or a preset such as
 * '@daily', as the `cron` package reads it, and must have a tick in the next eight years.
 * `where` starts the message (`schedule 'report.daily'`).
 */
export function assertCron(
  where: string,
  expr: unknown,
  timezone: unknown,
  error: ErrorClass = SqlQueueValidationError,
): void {
  if (typeof expr !== 'string' || expr.trim() === '' || expr.length > CRON_MAX_LENGTH) {
    throw new error(
      `${where}: cron must be a non-empty string of at most ${CRON_MAX_LENGTH} characters, got ${describe(expr)}`,
    );
  }
  assertTimezone(where, timezone, error);
  let time: CronTime;
  try {
    time = parse(expr, timezone as string);
  } catch (cause) {
    throw new error(
      `${where}: cron expression '${expr}' is invalid: ${(cause as Error).message} (use 5 fields 'minute hour day-of-month month day-of-week', or 6 with seconds first, e.g. '0 30 2 * * *')`,
    );
  }
  if (next(time, timezone as string, new Date()) === null) {
    throw new error(`${where}: cron expression '${expr}' never fires (no tick in the next 8 years)`);
  }
}

/**
 * An IANA zone name ('Europe/Stockholm', 'UTC'). Process-dependent names ('local', 'system')
 * and fixed offsets are refused: every instance must read the expression alike.
 */
function assertTimezone(where: string, timezone: unknown, error: ErrorClass): void {
  if (typeof timezone !== 'string' || timezone === '' || timezone.length > TIMEZONE_MAX_LENGTH) {
    throw new error(
      `${where}: timezone must be an IANA time zone name such as 'Europe/Stockholm' or 'UTC', got ${describe(timezone)}`,
    );
  }
  let known = true;
  try {
    new Intl.DateTimeFormat('en-US', { timeZone: timezone });
    new CronTime('* * * * *', timezone);
  } catch {
    known = false;
  }
  if (!known) {
    throw new error(
      `${where}: timezone '${timezone}' is not a known IANA time zone (use a name such as 'Europe/Stockholm', 'America/New_York' or 'UTC')`,
    );
  }
}

/**
 * The first tick strictly after `after`, or null when there is none in the next eight years.
 * Ticks are whole seconds. Over a DST change it follows the `cron` package: a wall-clock time
 * skipped by spring-forward fires at the first instant after the gap (02:30 → 03:00), and one
 * repeated by fall-back fires once (at its first occurrence) when reached from the tick before.
 */
export function nextTick(cron: string, timezone: string, after: Date): Date | null {
  return next(parse(cron, timezone), timezone, after);
}

/** Ticks t with fromInclusive <= t <= toInclusive, the earliest `max` of them, oldest first. */
export function ticksBetween(
  cron: string,
  timezone: string,
  fromInclusive: Date,
  toInclusive: Date,
  max: number,
): Date[] {
  const time = parse(cron, timezone);
  const ticks: Date[] = [];
  const end = toInclusive.getTime();
  let tick = next(time, timezone, new Date(fromInclusive.getTime() - 1));
  while (tick !== null && tick.getTime() <= end && ticks.length < max) {
    ticks.push(tick);
    tick = next(time, timezone, tick);
  }
  return ticks;
}

/**
 * The latest tick in [fromInclusive, toInclusive], or null when there is none. A binary search
 * on the start of nextTick (about 35 steps for a year), so a long outage of a schedule that
 * ticks every second costs no walk over its missed ticks.
 */
export function latestTick(cron: string, timezone: string, fromInclusive: Date, toInclusive: Date): Date | null {
  const time = parse(cron, timezone);
  const end = toInclusive.getTime();
  // Invariant: the first tick after `lo` is within range; none after `hi` is.
  let lo = fromInclusive.getTime() - 1;
  let found = next(time, timezone, new Date(lo));
  if (found === null || found.getTime() > end) return null;
  let hi = end;
  while (hi - lo > 1) {
    const mid = Math.floor((lo + hi) / 2);
    const tick = next(time, timezone, new Date(mid));
    if (tick !== null && tick.getTime() <= end) {
      lo = mid;
      found = tick;
    } else {
      hi = mid;
    }
  }
  // The search asks for the next tick from arbitrary instants. Around a DST fall-back, the
  // `cron` package's answer from inside the repeated hour can differ from what the chain of
  // ticks (each from the one before, as the scheduler fires them) gives: a daily 01:30 fires
  // once, but asked from within the second 01:00–01:59 it answers the second 01:30. So when the
  // found tick is within hours after a fall-back, the chain decides: the latest chained tick
  // well before the change (searched as above), then walked tick by tick to the end.
  const change = fallBackWithin(timezone, found.getTime(), DST_SETTLE_MS);
  if (change !== null) {
    const anchorEnd = change - DST_SETTLE_MS;
    const anchor =
      anchorEnd >= fromInclusive.getTime() ? latestTick(cron, timezone, fromInclusive, new Date(anchorEnd)) : null;
    return ticksBetween(cron, timezone, anchor ?? fromInclusive, toInclusive, Number.MAX_SAFE_INTEGER).at(-1) ?? null;
  }
  return found;
}

/** Longer than any DST shift: past it, the chain and the search agree again. */
const DST_SETTLE_MS = 3 * 3_600_000;

/**
 * The instant of a DST fall-back (the zone's offset decreasing) within `windowMs` before `at`,
 * or null. Offsets come from Intl, so no time zone data beyond what Node ships is needed.
 */
function fallBackWithin(timezone: string, at: number, windowMs: number): number | null {
  const before = offsetMs(timezone, at - windowMs);
  if (before <= offsetMs(timezone, at)) return null;
  // In whole seconds (offsets change on one): `before` at lo, changed at hi.
  let lo = Math.floor((at - windowMs) / 1_000);
  let hi = Math.floor(at / 1_000);
  while (hi - lo > 1) {
    const mid = Math.floor((lo + hi) / 2);
    if (offsetMs(timezone, mid * 1_000) === before) lo = mid;
    else hi = mid;
  }
  return hi * 1_000;
}

const offsetFormats = new Map<string, Intl.DateTimeFormat>();

/** The zone's offset from UTC at `at`, in ms (wall clock minus UTC). */
function offsetMs(timezone: string, at: number): number {
  let format = offsetFormats.get(timezone);
  if (!format) {
    format = new Intl.DateTimeFormat('en-US', {
      timeZone: timezone,
      hourCycle: 'h23',
      year: 'numeric',
      month: 'numeric',
      day: 'numeric',
      hour: 'numeric',
      minute: 'numeric',
      second: 'numeric',
    });
    offsetFormats.set(timezone, format);
  }
  const part = (parts: Intl.DateTimeFormatPart[], type: string) => Number(parts.find((p) => p.type === type)!.value);
  const parts = format.formatToParts(new Date(Math.floor(at / 1_000) * 1_000));
  const wall = Date.UTC(
    part(parts, 'year'),
    part(parts, 'month') - 1,
    part(parts, 'day'),
    part(parts, 'hour'),
    part(parts, 'minute'),
    part(parts, 'second'),
  );
  return wall - Math.floor(at / 1_000) * 1_000;
}

/**
 * The latest `max` ticks in [fromInclusive, toInclusive], oldest first. Reads windows backwards
 * from the end, sized from the ticks' spacing, so it walks about `max` ticks (not every tick of a
 * long range).
 */
export function latestTicks(
  cron: string,
  timezone: string,
  fromInclusive: Date,
  toInclusive: Date,
  max: number,
): Date[] {
  const from = fromInclusive.getTime();
  let hi = toInclusive.getTime();
  const latest = latestTick(cron, timezone, fromInclusive, toInclusive);
  if (latest === null || max <= 0) return [];
  const before = latestTick(cron, timezone, fromInclusive, new Date(latest.getTime() - 1));
  // One tick's spacing times the ticks wanted: the right window if the expression is regular.
  let span = Math.max(1_000, before === null ? hi - from : (latest.getTime() - before.getTime()) * max);
  let result: Date[] = [];
  while (result.length < max && hi >= from) {
    const need = max - result.length;
    const lo = Math.max(from, hi - span);
    const cap = 4 * need;
    const window = ticksBetween(cron, timezone, new Date(lo), new Date(hi), cap);
    if (window.length === cap) {
      // Denser than thought (the window may hold more): shrink it to about `need` ticks, read again.
      const perTick = (window[cap - 1]!.getTime() - lo) / cap;
      span = Math.max(1_000, Math.min(Math.floor(perTick * need * 1.25), Math.floor((hi - lo) / 2)));
      continue;
    }
    result = [...window.slice(-need), ...result];
    hi = lo - 1;
    span *= 2;
  }
  return result;
}

/** Parsed expressions, by zone and text (a scheduler reads the same few over and over). */
const parsed = new Map<string, CronTime>();
const PARSED_MAX = 512;

function parse(cron: string, timezone: string): CronTime {
  const key = `${timezone}\u0000${cron}`;
  let time = parsed.get(key);
  if (time === undefined) {
    time = new CronTime(cron, timezone);
    if (parsed.size >= PARSED_MAX) parsed.delete(parsed.keys().next().value!);
    parsed.set(key, time);
  }
  return time;
}

function next(time: CronTime, timezone: string, after: Date): Date | null {
  let from = after;
  // Strictly after, whatever the package does around a DST change (it never has: a guard).
  for (let attempt = 0; attempt < 4; attempt++) {
    let tick: Date;
    try {
      tick = time.getNextDateFrom(from, timezone).toJSDate();
    } catch (error) {
      // The package gives up past eight years from now: the expression has no later tick.
      if (/No execution date was found/.test((error as Error).message)) return null;
      throw error;
    }
    if (tick.getTime() > after.getTime()) return tick;
    from = new Date(Math.max(tick.getTime(), from.getTime()) + 1_000);
  }
  return null;
}
