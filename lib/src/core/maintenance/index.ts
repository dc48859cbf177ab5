// Upkeep: the lease reaper, retention, the group repair sweep, and the schema-version check.
export { cleanupFinishedJobs, reapExpiredLeases, repairGroups } from './maintenance.js';
export { assertSchemaVersion } from './schema-version.js';
