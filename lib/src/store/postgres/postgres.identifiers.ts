import { createHash } from 'node:crypto';

/** Double-quotes a validated identifier; a `"` inside is doubled, as PostgreSQL requires. */
export function quotePgIdentifier(name: string): string {
  return `"${name.replace(/"/g, '""')}"`;
}

/** PostgreSQL's identifier limit (NAMEDATALEN - 1); schema names are ASCII, so bytes = characters. */
const PG_NAME_MAX_BYTES = 63;

/**
 * A digest of the schema name, for names PostgreSQL would cut at 63 bytes (long schema names
 * would make statement names collide, node-postgres tracking the full name, and the channel too long).
 */
export function pgSchemaDigest(schema: string): string {
  return createHash('sha1').update(schema).digest('hex').slice(0, 16);
}

/** The schema's wake-up channel (payload: a queue name): readable where it fits, as earlier versions named it. */
export function pgWakeChannel(schema: string): string {
  return schema.length + '_wake'.length <= PG_NAME_MAX_BYTES
    ? `${schema}_wake`
    : `sqlqueue_${pgSchemaDigest(schema)}_wake`;
}
