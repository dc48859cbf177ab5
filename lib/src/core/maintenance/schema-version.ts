import { SqlQueueSchemaError } from '../errors.js';
import type { Dialect } from '../queue-store.js';

/**
 * The version rule both stores apply at boot: a schema newer than this build is refused in
 * every mode; in 'check' mode an older one is refused too, with the command that prints the
 * upgrade script.
 */
export function assertSchemaVersion(
  dialect: Dialect,
  schema: string,
  current: number,
  latest: number,
  mode: 'auto' | 'check',
): void {
  const name = dialect === 'mssql' ? `[${schema}]` : `"${schema}"`;
  if (current > latest) {
    throw new SqlQueueSchemaError(
      `schema ${name} is at version ${current}, newer than this nestjs-sql-queue (knows up to ${latest}): upgrade the package before running it against this database`,
    );
  }
  if (mode === 'check' && current < latest) {
    throw new SqlQueueSchemaError(
      `schema ${name} is at version ${current}, this nestjs-sql-queue needs ${latest}: set migrations: 'auto', or apply the script from \`npx nestjs-sql-queue sql --dialect ${dialect} --schema ${schema} --from ${current}\``,
    );
  }
}
