/** Brackets a validated identifier; a `]` inside is doubled, as T-SQL requires. */
export function quoteMssqlIdentifier(name: string): string {
  return `[${name.replace(/]/g, ']]')}]`;
}
