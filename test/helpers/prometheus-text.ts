/**
 * A strict reader of the Prometheus text exposition format (version 0.0.4), for tests: it
 * throws on anything a Prometheus server would reject or misread, with the line number.
 *
 * Checked: metric and label name syntax; label value escaping; sample values (floats, +Inf,
 * -Inf, NaN) and optional integer timestamps; at most one HELP and one TYPE per family, TYPE
 * before the family's samples; a family's samples contiguous; no duplicate series; counters'
 * and histograms' values non-negative; histograms with an `le` label on every bucket,
 * cumulative buckets ending at +Inf, and `_sum`/`_count` per series with `_count` equal to
 * the +Inf bucket.
 */
export interface PromSample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

export interface PromFamily {
  name: string;
  type: 'counter' | 'gauge' | 'histogram' | 'summary' | 'untyped';
  help: string | null;
  samples: PromSample[];
}

const METRIC_NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/;
const LABEL_NAME = /^[a-zA-Z_][a-zA-Z0-9_]*$/;
const TYPES = new Set(['counter', 'gauge', 'histogram', 'summary', 'untyped']);

function parseValue(text: string, where: string): number {
  if (text === '+Inf') return Infinity;
  if (text === '-Inf') return -Infinity;
  if (text === 'NaN') return NaN;
  if (!/^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$/.test(text)) throw new Error(`${where}: invalid value '${text}'`);
  return Number(text);
}

/** Parses `name{a="x",b="y"} value [timestamp]`. */
function parseSample(line: string, where: string): PromSample {
  const nameMatch = /^[a-zA-Z_:][a-zA-Z0-9_:]*/.exec(line);
  if (!nameMatch) throw new Error(`${where}: a sample line must start with a metric name`);
  const name = nameMatch[0];
  let i = name.length;
  const labels: Record<string, string> = {};
  if (line[i] === '{') {
    i++;
    for (;;) {
      while (line[i] === ' ') i++;
      if (line[i] === '}') {
        i++;
        break;
      }
      const labelMatch = /^[a-zA-Z_][a-zA-Z0-9_]*/.exec(line.slice(i));
      if (!labelMatch) throw new Error(`${where}: invalid label name at column ${i + 1}`);
      const label = labelMatch[0];
      i += label.length;
      if (line[i] !== '=' || line[i + 1] !== '"') throw new Error(`${where}: expected ="…" after label ${label}`);
      i += 2;
      let value = '';
      for (;;) {
        const c = line[i];
        if (c === undefined) throw new Error(`${where}: unterminated value of label ${label}`);
        if (c === '"') break;
        if (c === '\\') {
          const next = line[i + 1];
          if (next === '\\') value += '\\';
          else if (next === '"') value += '"';
          else if (next === 'n') value += '\n';
          else throw new Error(`${where}: invalid escape \\${next ?? ''} in label ${label}`);
          i += 2;
          continue;
        }
        value += c;
        i++;
      }
      i++;
      if (label in labels) throw new Error(`${where}: label ${label} repeated`);
      labels[label] = value;
      if (line[i] === ',') i++;
      else if (line[i] !== '}') throw new Error(`${where}: expected , or } after label ${label}`);
    }
  }
  if (line[i] !== ' ') throw new Error(`${where}: expected a space before the value`);
  const rest = line
    .slice(i + 1)
    .trim()
    .split(/\s+/);
  if (rest.length < 1 || rest.length > 2 || rest[0] === '') throw new Error(`${where}: expected value [timestamp]`);
  const value = parseValue(rest[0]!, where);
  if (rest[1] !== undefined && !/^-?\d+$/.test(rest[1])) throw new Error(`${where}: invalid timestamp '${rest[1]}'`);
  return { name, labels, value };
}

/** The family a sample belongs to: histogram and summary series carry suffixes. */
function familyOf(sample: string, families: Map<string, PromFamily>): string {
  for (const suffix of ['_bucket', '_sum', '_count']) {
    if (sample.endsWith(suffix)) {
      const base = sample.slice(0, -suffix.length);
      const family = families.get(base);
      if (family && (family.type === 'histogram' || family.type === 'summary')) return base;
    }
  }
  return sample;
}

function seriesKey(labels: Record<string, string>, omit?: string): string {
  return JSON.stringify(
    Object.entries(labels)
      .filter(([k]) => k !== omit)
      .sort(([a], [b]) => (a < b ? -1 : 1)),
  );
}

function checkHistogram(family: PromFamily): void {
  const series = new Map<string, { buckets: [number, number][]; sum?: number; count?: number }>();
  for (const s of family.samples) {
    const key = seriesKey(s.labels, 'le');
    const entry = series.get(key) ?? { buckets: [] };
    series.set(key, entry);
    if (s.name === `${family.name}_bucket`) {
      if (!('le' in s.labels)) throw new Error(`histogram ${family.name}: a bucket without an le label`);
      entry.buckets.push([parseValue(s.labels.le!, `histogram ${family.name} le`), s.value]);
    } else if (s.name === `${family.name}_sum`) entry.sum = s.value;
    else if (s.name === `${family.name}_count`) entry.count = s.value;
    else throw new Error(`histogram ${family.name}: unexpected sample ${s.name}`);
  }
  for (const [key, entry] of series) {
    const where = `histogram ${family.name}${key}`;
    if (entry.buckets.length === 0) throw new Error(`${where}: no buckets`);
    const sorted = [...entry.buckets].sort((a, b) => a[0] - b[0]);
    if (sorted[sorted.length - 1]![0] !== Infinity) throw new Error(`${where}: no +Inf bucket`);
    for (let i = 1; i < sorted.length; i++) {
      if (sorted[i]![1] < sorted[i - 1]![1]) throw new Error(`${where}: buckets are not cumulative`);
    }
    if (entry.sum === undefined || entry.count === undefined) throw new Error(`${where}: _sum or _count missing`);
    if (entry.count !== sorted[sorted.length - 1]![1]) throw new Error(`${where}: _count differs from the +Inf bucket`);
  }
}

/** Parses and checks an exposition; throws on the first problem. */
export function parsePrometheusText(text: string): Map<string, PromFamily> {
  if (!text.endsWith('\n')) throw new Error('the exposition must end with a line feed');
  const families = new Map<string, PromFamily>();
  const closed = new Set<string>();
  const seen = new Set<string>();
  let current: string | null = null;
  const lines = text.split('\n');
  lines.pop();
  lines.forEach((line, index) => {
    const where = `line ${index + 1}`;
    if (line.trim() === '') return;
    const enter = (name: string) => {
      if (current !== name) {
        if (current) closed.add(current);
        if (closed.has(name)) throw new Error(`${where}: samples of ${name} are not contiguous`);
        current = name;
      }
    };
    if (line.startsWith('#')) {
      const m = /^# (HELP|TYPE) (\S+)(?: (.*))?$/.exec(line);
      if (!m) return; // another comment
      const [, kind, name, rest = ''] = m;
      if (!METRIC_NAME.test(name!)) throw new Error(`${where}: invalid metric name '${name}'`);
      enter(name!);
      const family = families.get(name!) ?? { name: name!, type: 'untyped', help: null, samples: [] };
      families.set(name!, family);
      if (kind === 'HELP') {
        if (family.help !== null) throw new Error(`${where}: second HELP for ${name}`);
        family.help = rest;
      } else {
        if (!TYPES.has(rest)) throw new Error(`${where}: unknown type '${rest}'`);
        if (family.samples.length > 0) throw new Error(`${where}: TYPE of ${name} after its samples`);
        if ((family as { typed?: boolean }).typed) throw new Error(`${where}: second TYPE for ${name}`);
        (family as { typed?: boolean }).typed = true;
        family.type = rest as PromFamily['type'];
      }
      return;
    }
    const sample = parseSample(line, where);
    for (const label of Object.keys(sample.labels)) {
      if (!LABEL_NAME.test(label) || label.startsWith('__')) throw new Error(`${where}: reserved label ${label}`);
    }
    const familyName = familyOf(sample.name, families);
    enter(familyName);
    const family = families.get(familyName) ?? { name: familyName, type: 'untyped', help: null, samples: [] };
    families.set(familyName, family);
    const key = `${sample.name}${seriesKey(sample.labels)}`;
    if (seen.has(key)) throw new Error(`${where}: duplicate series ${key}`);
    seen.add(key);
    if ((family.type === 'counter' || family.type === 'histogram') && !(sample.value >= 0)) {
      throw new Error(`${where}: ${family.type} ${sample.name} has a negative or NaN value`);
    }
    family.samples.push(sample);
  });
  for (const family of families.values()) {
    delete (family as { typed?: boolean }).typed;
    if (family.type === 'histogram') checkHistogram(family);
  }
  return families;
}

/** The value of one series, or undefined when it is absent. */
export function sampleValue(
  families: Map<string, PromFamily>,
  name: string,
  labels: Record<string, string> = {},
): number | undefined {
  for (const family of families.values()) {
    for (const s of family.samples) {
      if (s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v)) return s.value;
    }
  }
  return undefined;
}
