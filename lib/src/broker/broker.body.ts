import { SqlQueueError, SqlQueueValidationError } from '../core/errors.js';
import { describe } from '../core/validation.js';
import type { BrokerBodyFormat } from './broker.types.js';

// Message bodies travel as varbinary(max). The one place that turns a caller's value into those
// bytes and back, shared by the sender, the readers and the dead-message admin, so a body sent by
// `send()` and one sent by a T-SQL producer decode the same way.
//
// - json: UTF-16LE bytes of JSON.stringify, no BOM: what `CAST(N'…' AS varbinary(max))` gives,
//   so a T-SQL consumer reads it with `CAST(message_body AS nvarchar(max))`. Decoding also takes
//   UTF-8 and a BOM, because T-SQL producers sending `CAST('…' AS varbinary(max))` (varchar) or
//   an xml value exist.
// - raw: the bytes as they are.
// - xml: UTF-16LE with a BOM, which is what SQL Server itself produces when it casts xml to
//   varbinary ("Define the serialization of XML data": UTF-16 with a byte order mark). A varbinary
//   reaches the XML parser as a code-point stream that must name its encoding (BOM or
//   declaration), so UTF-16 without a BOM could fail a WELL_FORMED_XML message type. A document
//   whose declaration says encoding="UTF-8" is sent as UTF-8 instead (UTF-16 bytes under that
//   declaration are "unable to switch the encoding").

/** A body read from a queue that does not decode in the queue's format. */
export class SqlQueueBrokerBodyError extends SqlQueueError {}

const UTF16LE_BOM = Buffer.from([0xff, 0xfe]);
const XML_DECLARED_ENCODING = /^<\?xml\s[^>]*?\bencoding\s*=\s*["']([A-Za-z0-9._-]+)["']/;

/**
 * The bytes to SEND for `body` in `format`; throws SqlQueueValidationError before any SQL runs
 * when the body cannot be encoded or its bytes exceed `maxBytes`. `where` starts the message
 * (`send to broker queue 'orders'`).
 */
export function encodeBrokerBody(format: BrokerBodyFormat, body: unknown, maxBytes: number, where: string): Buffer {
  const bytes = encode(format, body, maxBytes, where);
  if (bytes.length > maxBytes) throw tooLarge(where, bytes.length, maxBytes, format);
  return bytes;
}

function encode(format: BrokerBodyFormat, body: unknown, maxBytes: number, where: string): Buffer {
  switch (format) {
    case 'json': {
      let json: string | undefined;
      try {
        json = JSON.stringify(body);
      } catch (error) {
        throw new SqlQueueValidationError(`${where}: body is not JSON-serializable (${(error as Error).message})`);
      }
      if (json === undefined) {
        throw new SqlQueueValidationError(`${where}: body is not JSON-serializable (got ${typeof body})`);
      }
      // Two bytes per UTF-16 code unit: refuse before allocating a buffer over the limit.
      if (json.length * 2 > maxBytes) throw tooLarge(where, json.length * 2, maxBytes, format);
      return Buffer.from(json, 'utf16le');
    }
    case 'raw': {
      if (Buffer.isBuffer(body)) return body;
      if (body instanceof Uint8Array) return Buffer.from(body.buffer, body.byteOffset, body.byteLength);
      throw new SqlQueueValidationError(
        `${where}: the queue's format is 'raw', which sends a Buffer or Uint8Array; got ${describe(body)} (use format 'json' for objects)`,
      );
    }
    case 'xml': {
      if (typeof body !== 'string' || body.trim() === '') {
        throw new SqlQueueValidationError(
          `${where}: the queue's format is 'xml', which sends a non-empty XML document as a string; got ${describe(body)}`,
        );
      }
      const text = body.startsWith('\uFEFF') ? body.slice(1) : body;
      const declared = XML_DECLARED_ENCODING.exec(text)?.[1]?.toLowerCase();
      if (declared === 'utf-8' || declared === 'utf8') return Buffer.from(text, 'utf8');
      if (declared !== undefined && declared !== 'utf-16' && declared !== 'utf16') {
        throw new SqlQueueValidationError(
          `${where}: the XML declaration names encoding '${declared}'; send UTF-8 or UTF-16 (remove the encoding attribute to send UTF-16)`,
        );
      }
      if (text.length * 2 + 2 > maxBytes) throw tooLarge(where, text.length * 2 + 2, maxBytes, format);
      return Buffer.concat([UTF16LE_BOM, Buffer.from(text, 'utf16le')]);
    }
    default:
      throw new SqlQueueValidationError(`${where}: unknown body format ${describe(format)}`);
  }
}

function tooLarge(where: string, bytes: number, maxBytes: number, format: BrokerBodyFormat): SqlQueueValidationError {
  const unit = format === 'json' ? ' (UTF-16)' : '';
  return new SqlQueueValidationError(
    `${where}: body is ${bytes} bytes${unit}, over the limit of ${maxBytes} (maxPayloadBytes; store large documents elsewhere and send a reference)`,
  );
}

/**
 * The value handed to a handler for a received body: parsed JSON, the bytes, or the XML text.
 * An absent or empty body is null (json), an empty Buffer (raw) or '' (xml). Throws
 * SqlQueueBrokerBodyError when the bytes do not decode.
 */
export function decodeBrokerBody(format: BrokerBodyFormat, bytes: Buffer | Uint8Array | null | undefined): unknown {
  const buffer = bytes == null ? Buffer.alloc(0) : Buffer.isBuffer(bytes) ? bytes : Buffer.from(bytes);
  if (format === 'raw') return buffer;
  if (buffer.length === 0) return format === 'json' ? null : '';
  const text = decodeBrokerText(buffer);
  return format === 'xml' ? text : parseBrokerJson(text);
}

/** The value of a JSON body's text; throws SqlQueueBrokerBodyError when it is not JSON. */
export function parseBrokerJson(text: string): unknown {
  try {
    return JSON.parse(text) as unknown;
  } catch (error) {
    throw new SqlQueueBrokerBodyError(`message body is not JSON: ${(error as Error).message}`);
  }
}

const strictUtf8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

/**
 * Text of a body whose encoding it does not declare: a UTF-16 BOM (either order) or a UTF-8 BOM
 * decides; without one, a second byte 0 after a non-zero first byte is UTF-16LE (JSON and XML
 * text starts with an ASCII character, which UTF-16LE follows with 0 and UTF-8 never does);
 * anything else is UTF-8. Throws SqlQueueBrokerBodyError for bytes invalid in that encoding.
 */
export function decodeBrokerText(bytes: Buffer): string {
  if (bytes.length >= 2 && bytes[0] === 0xff && bytes[1] === 0xfe) return utf16le(bytes.subarray(2));
  if (bytes.length >= 2 && bytes[0] === 0xfe && bytes[1] === 0xff) return utf16le(swapPairs(bytes.subarray(2)));
  if (bytes.length >= 3 && bytes[0] === 0xef && bytes[1] === 0xbb && bytes[2] === 0xbf) return utf8(bytes.subarray(3));
  if (bytes.length >= 2 && bytes[0] !== 0 && bytes[1] === 0) return utf16le(bytes);
  return utf8(bytes);
}

function utf16le(bytes: Buffer): string {
  if (bytes.length % 2 !== 0) {
    throw new SqlQueueBrokerBodyError(`message body looks like UTF-16 but has an odd length (${bytes.length} bytes)`);
  }
  return bytes.toString('utf16le');
}

function utf8(bytes: Buffer): string {
  try {
    return strictUtf8.decode(bytes);
  } catch {
    throw new SqlQueueBrokerBodyError('message body is neither UTF-16LE nor valid UTF-8 text');
  }
}

function swapPairs(bytes: Buffer): Buffer {
  const copy = Buffer.from(bytes);
  if (copy.length % 2 === 0) copy.swap16();
  return copy;
}

/** What an `Error` message from Service Broker or the other side says. */
export interface BrokerErrorInfo {
  /** Negative: a Service Broker error (-8489: the dialog exceeded its lifetime); positive: END CONVERSATION WITH ERROR = n. */
  code: number | null;
  description: string;
}

/**
 * Reads the body of an `http://schemas.microsoft.com/SQL/ServiceBroker/Error` message:
 * `<Error xmlns="http://schemas.microsoft.com/SQL/ServiceBroker/Error"><Code>…</Code>
 * <Description>…</Description></Error>`. Never throws: a body it cannot read comes back as its
 * text (or a note) with code null, since it is only logged.
 */
export function parseBrokerErrorBody(bytes: Buffer | Uint8Array | null | undefined): BrokerErrorInfo {
  if (bytes == null || bytes.length === 0) return { code: null, description: '(no error body)' };
  let text: string;
  try {
    text = decodeBrokerText(Buffer.isBuffer(bytes) ? bytes : Buffer.from(bytes));
  } catch {
    return { code: null, description: `(an error body of ${bytes.length} bytes that is not text)` };
  }
  const element = (name: string) =>
    new RegExp(`<(?:\\w+:)?${name}(?:\\s[^>]*)?>([\\s\\S]*?)</(?:\\w+:)?${name}>`).exec(text)?.[1];
  const code = element('Code');
  const description = element('Description');
  if (code === undefined && description === undefined) return { code: null, description: text };
  const parsed = code === undefined ? NaN : Number.parseInt(code.trim(), 10);
  return { code: Number.isNaN(parsed) ? null : parsed, description: unescapeXml(description ?? '').trim() };
}

function unescapeXml(text: string): string {
  const named: Record<string, string> = { lt: '<', gt: '>', amp: '&', quot: '"', apos: "'" };
  return text.replace(/&(#x[0-9a-fA-F]+|#\d+|lt|gt|amp|quot|apos);/g, (_, entity: string) =>
    entity.startsWith('#x')
      ? String.fromCodePoint(Number.parseInt(entity.slice(2), 16))
      : entity.startsWith('#')
        ? String.fromCodePoint(Number.parseInt(entity.slice(1), 10))
        : named[entity]!,
  );
}
