// Keyset-paged job listings (the dashboard's): request checks, cursors, and the rows a store returns.
export {
  checkJobListRequest,
  encodeJobListCursor,
  JOB_LIST_STATEMENTS,
  type JobListPosition,
  splitJobListRows,
} from './job-list-cursor.js';
