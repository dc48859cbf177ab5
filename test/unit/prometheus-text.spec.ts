import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import { describe, expect, it } from 'vitest';
import { parsePrometheusText, sampleValue } from '../helpers/prometheus-text.js';

describe('the strict Prometheus text reader used by the tests', () => {
  it('reads prom-client output, escapes included', async () => {
    const registry = new Registry();
    new Gauge({ name: 'g', help: 'h', labelNames: ['q'], registers: [registry] }).set({ q: 'a"b\\c\nd' }, 1.5);
    new Counter({ name: 'c_total', help: 'h', registers: [registry] }).inc(2);
    new Histogram({ name: 'h_seconds', help: 'h', buckets: [0.1, 1], registers: [registry] }).observe(0.5);
    const families = parsePrometheusText(await registry.metrics());
    expect(sampleValue(families, 'g', { q: 'a"b\\c\nd' })).toBe(1.5);
    expect(families.get('h_seconds')?.type).toBe('histogram');
    expect(sampleValue(families, 'h_seconds_bucket', { le: '+Inf' })).toBe(1);
  });

  const histogram = (buckets: string) => `# TYPE h histogram\n${buckets}h_sum 1\nh_count 2\n`;

  it.each([
    ['no final line feed', 'a 1'],
    ['a bad metric name', '1a 1\n'],
    ['an unterminated label value', 'a{q="x} 1\n'],
    ['an invalid escape', 'a{q="\\t"} 1\n'],
    ['a value that is not a number', 'a one\n'],
    ['a duplicate series', 'a{q="x"} 1\na{q="x"} 2\n'],
    ['a TYPE after samples', 'a 1\n# TYPE a gauge\n'],
    ['a family split in two', 'a 1\nb 1\na{q="x"} 1\n'],
    ['a negative counter', '# TYPE c counter\nc -1\n'],
    ['buckets that are not cumulative', histogram('h_bucket{le="1"} 2\nh_bucket{le="+Inf"} 1\n')],
    ['a histogram without +Inf', histogram('h_bucket{le="1"} 2\n')],
    ['_count unlike +Inf', histogram('h_bucket{le="1"} 1\nh_bucket{le="+Inf"} 1\n')],
  ])('rejects %s', (_, text) => {
    expect(() => parsePrometheusText(text)).toThrow();
  });
});
