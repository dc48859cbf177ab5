// The SQL Server side of the driver port (BrokerDriver in broker.types.ts): the only broker code
// that loads `mssql`, imported on demand; and the commit-or-rollback rule of receiving sessions.
export { createMssqlBrokerDriver } from './broker.mssql-driver.js';
export { commitOrRollback } from './broker.session.js';
