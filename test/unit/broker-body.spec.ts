import { describe, expect, it } from 'vitest';
import {
  SqlQueueBrokerBodyError,
  decodeBrokerBody,
  decodeBrokerText,
  encodeBrokerBody,
  parseBrokerErrorBody,
} from '../../lib/src/broker/broker.body.js';
import { SqlQueueValidationError } from '../../lib/src/core/errors.js';

const where = "send to broker queue 'orders'";
const MAX = 1024 * 1024;

describe('broker bodies: json', () => {
  it('encodes as UTF-16LE without BOM, the bytes of CAST(N... AS varbinary(max))', () => {
    const bytes = encodeBrokerBody('json', { id: 7, name: 'Zoë' }, MAX, where);
    // N'{"id":7,"name":"Zoë"}' as varbinary: every code unit little-endian, no FF FE.
    expect(bytes.subarray(0, 4)).toEqual(Buffer.from([0x7b, 0x00, 0x22, 0x00]));
    expect(bytes.toString('utf16le')).toBe('{"id":7,"name":"Zoë"}');
  });

  it('round-trips, and decodes UTF-16LE with a BOM and UTF-8 with and without one', () => {
    const value = { a: [1, 'ü', null], b: '日本' };
    const text = JSON.stringify(value);
    expect(decodeBrokerBody('json', encodeBrokerBody('json', value, MAX, where))).toEqual(value);
    expect(decodeBrokerBody('json', Buffer.concat([Buffer.from([0xff, 0xfe]), Buffer.from(text, 'utf16le')]))).toEqual(
      value,
    );
    expect(decodeBrokerBody('json', Buffer.from(text, 'utf8'))).toEqual(value);
    expect(decodeBrokerBody('json', Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from(text)]))).toEqual(
      value,
    );
  });

  it('decodes one-byte UTF-8 JSON and an empty or absent body as null', () => {
    expect(decodeBrokerBody('json', Buffer.from('5'))).toBe(5);
    expect(decodeBrokerBody('json', Buffer.alloc(0))).toBeNull();
    expect(decodeBrokerBody('json', null)).toBeNull();
  });

  it('refuses what JSON cannot carry, before any SQL', () => {
    expect(() => encodeBrokerBody('json', undefined, MAX, where)).toThrow(SqlQueueValidationError);
    expect(() => encodeBrokerBody('json', () => 1, MAX, where)).toThrow(/not JSON-serializable/);
    const cyclic: Record<string, unknown> = {};
    cyclic.self = cyclic;
    expect(() => encodeBrokerBody('json', cyclic, MAX, where)).toThrow(
      /send to broker queue 'orders': body is not JSON/,
    );
  });

  it('counts the limit in sent bytes (two per UTF-16 code unit) and names maxPayloadBytes', () => {
    expect(encodeBrokerBody('json', 'x'.repeat(8), 20, where)).toHaveLength(20); // "xxxxxxxx" = 10 units
    expect(() => encodeBrokerBody('json', 'x'.repeat(9), 20, where)).toThrow(
      /body is 22 bytes \(UTF-16\), over the limit of 20 \(maxPayloadBytes/,
    );
  });

  it('throws SqlQueueBrokerBodyError for bytes that are not JSON or not text', () => {
    expect(() => decodeBrokerBody('json', Buffer.from('{oops', 'utf16le'))).toThrow(SqlQueueBrokerBodyError);
    expect(() => decodeBrokerBody('json', Buffer.from([0x7b, 0xc3, 0x28, 0x7d]))).toThrow(
      /neither UTF-16LE nor valid UTF-8/,
    );
    expect(() => decodeBrokerBody('json', Buffer.from([0x7b, 0x00, 0x7d]))).toThrow(/odd length/);
  });
});

describe('broker bodies: raw', () => {
  it('sends a Buffer or Uint8Array as is and hands back the bytes', () => {
    const buffer = Buffer.from([0, 1, 2, 255]);
    expect(encodeBrokerBody('raw', buffer, MAX, where)).toBe(buffer);
    const view = new Uint8Array([9, 8, 7, 6]).subarray(1, 3);
    expect([...encodeBrokerBody('raw', view, MAX, where)]).toEqual([8, 7]);
    expect(decodeBrokerBody('raw', buffer)).toEqual(buffer);
    expect(decodeBrokerBody('raw', null)).toEqual(Buffer.alloc(0));
  });

  it('refuses anything else and bodies over the limit', () => {
    expect(() => encodeBrokerBody('raw', 'text', MAX, where)).toThrow(/format is 'raw', which sends a Buffer/);
    expect(() => encodeBrokerBody('raw', { a: 1 }, MAX, where)).toThrow(SqlQueueValidationError);
    expect(() => encodeBrokerBody('raw', Buffer.alloc(11), 10, where)).toThrow(/11 bytes, over the limit of 10/);
  });
});

describe('broker bodies: xml', () => {
  it('sends UTF-16LE with a BOM, as SQL Server casts xml to varbinary, and decodes it back', () => {
    const bytes = encodeBrokerBody('xml', '<Δ/>', MAX, where);
    // CAST(CAST(N'<Δ/>' AS xml) AS varbinary(max)) = 0xFFFE3C0094032F003E00
    expect(bytes).toEqual(Buffer.from('FFFE3C0094032F003E00', 'hex'));
    expect(decodeBrokerBody('xml', bytes)).toBe('<Δ/>');
  });

  it('sends a document declared UTF-8 as UTF-8, and a declared UTF-16 one as UTF-16', () => {
    const utf8 = '<?xml version="1.0" encoding="UTF-8"?><a>ü</a>';
    expect(encodeBrokerBody('xml', utf8, MAX, where)).toEqual(Buffer.from(utf8, 'utf8'));
    expect(decodeBrokerBody('xml', encodeBrokerBody('xml', utf8, MAX, where))).toBe(utf8);
    const utf16 = "<?xml version='1.0' encoding='utf-16'?><a/>";
    expect(encodeBrokerBody('xml', utf16, MAX, where).subarray(0, 2)).toEqual(Buffer.from([0xff, 0xfe]));
  });

  it('decodes UTF-16LE without a BOM (a T-SQL producer sending an nvarchar)', () => {
    expect(decodeBrokerBody('xml', Buffer.from('<a>x</a>', 'utf16le'))).toBe('<a>x</a>');
  });

  it('refuses non-strings, empty documents and encodings it cannot produce', () => {
    expect(() => encodeBrokerBody('xml', { a: 1 }, MAX, where)).toThrow(/format is 'xml'/);
    expect(() => encodeBrokerBody('xml', '  ', MAX, where)).toThrow(/non-empty XML document/);
    expect(() => encodeBrokerBody('xml', '<?xml version="1.0" encoding="ISO-8859-1"?><a/>', MAX, where)).toThrow(
      /encoding 'iso-8859-1'/,
    );
    expect(() => encodeBrokerBody('xml', '<a/>', 9, where)).toThrow(/10 bytes, over the limit of 9/);
  });
});

describe('decodeBrokerText', () => {
  it('takes big-endian UTF-16 with its BOM too', () => {
    const le = Buffer.from('{"k":1}', 'utf16le');
    const be = Buffer.concat([Buffer.from([0xfe, 0xff]), Buffer.from(le).swap16()]);
    expect(decodeBrokerText(be)).toBe('{"k":1}');
  });
});

describe('parseBrokerErrorBody', () => {
  it('reads Code and Description of a Service Broker Error message (UTF-16, with or without BOM)', () => {
    const xml =
      '<Error xmlns="http://schemas.microsoft.com/SQL/ServiceBroker/Error"><Code>-8489</Code><Description>The dialog has exceeded the specified LIFETIME.</Description></Error>';
    expect(parseBrokerErrorBody(Buffer.from(xml, 'utf16le'))).toEqual({
      code: -8489,
      description: 'The dialog has exceeded the specified LIFETIME.',
    });
    const withBom = Buffer.concat([Buffer.from([0xff, 0xfe]), Buffer.from(xml, 'utf16le')]);
    expect(parseBrokerErrorBody(withBom).code).toBe(-8489);
  });

  it('unescapes the description of an END CONVERSATION WITH ERROR and never throws', () => {
    const xml = '<Error><Code>50001</Code><Description>handler failed: a &lt; b &amp;&#x41;</Description></Error>';
    expect(parseBrokerErrorBody(Buffer.from(xml))).toEqual({ code: 50001, description: 'handler failed: a < b &A' });
    expect(parseBrokerErrorBody(null)).toEqual({ code: null, description: '(no error body)' });
    expect(parseBrokerErrorBody(Buffer.from('plain text'))).toEqual({ code: null, description: 'plain text' });
    expect(parseBrokerErrorBody(Buffer.from([0xc3, 0x28])).code).toBeNull();
  });
});
