import { quotePgIdentifier } from '../postgres.identifiers.js';

/** The schema's names every statement is built from: the schema itself and its tables and sequence, quoted. */
export interface PgTables {
  /** The schema name as given (validated at boot). */
  schema: string;
  jobs: string;
  attempts: string;
  jobIdSeq: string;
  settings: string;
  groups: string;
  schedules: string;
  throughput: string;
  pauses: string;
  flowState: string;
}

export function pgTables(schema: string): PgTables {
  const s = quotePgIdentifier(schema);
  return {
    schema,
    jobs: `${s}.jobs`,
    attempts: `${s}.attempts`,
    jobIdSeq: `${s}.jobs_id_seq`,
    settings: `${s}.queue_settings`,
    groups: `${s}.groups`,
    schedules: `${s}.schedules`,
    throughput: `${s}.throughput`,
    pauses: `${s}.queue_pauses`,
    flowState: `${s}.flow_state`,
  };
}
