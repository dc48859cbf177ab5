import { quoteMssqlIdentifier } from '../mssql.identifiers.js';

/** The schema's names every statement is built from: the schema itself and its tables, bracket-quoted. */
export interface MssqlTables {
  /** The schema name as given (validated at boot). */
  schema: string;
  /** The schema, bracket-quoted. */
  s: string;
  jobs: string;
  attempts: string;
  settings: string;
  groups: string;
  schedules: string;
  throughput: string;
  pauses: string;
  flowState: string;
  flowStarts: string;
}

export function mssqlTables(schema: string): MssqlTables {
  const s = quoteMssqlIdentifier(schema);
  return {
    schema,
    s,
    jobs: `${s}.[Jobs]`,
    attempts: `${s}.[Attempts]`,
    settings: `${s}.[QueueSettings]`,
    groups: `${s}.[Groups]`,
    schedules: `${s}.[Schedules]`,
    throughput: `${s}.[Throughput]`,
    pauses: `${s}.[QueuePauses]`,
    flowState: `${s}.[FlowState]`,
    flowStarts: `${s}.[FlowStarts]`,
  };
}

/** Table types; the store names them when it binds table-valued parameters. */
export const MSSQL_TABLE_TYPES = {
  jobInput: 'JobInputListV4',
  owned: 'OwnedJobList',
  completion: 'CompletionList',
  heartbeat: 'HeartbeatListV2',
  failure: 'FailureList',
  ids: 'IdList',
  scheduleUpsert: 'ScheduleUpsertList',
  scheduleAdvance: 'ScheduleAdvanceList',
  // V2 carries BusyMs (version 17); V1 stays for the previous release's processes during a rolling upgrade.
  throughputCounts: 'ThroughputCountListV2',
} as const;
