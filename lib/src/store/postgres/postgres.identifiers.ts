/** Double-quotes a validated identifier; a `"` inside is doubled, as PostgreSQL requires. */
export function quotePgIdentifier(name: string): string {
  return `"${name.replace(/"/g, '""')}"`;
}
