/**
 * The whole store contract (store-contract.ts), the flow control contract
 * (store-flow-contract.ts) and the handler transaction contract (store-handler-transaction.ts) on both SQL Server databases (review 2026-12-01, F1 and test plan
 * items 1–3): READ_COMMITTED_SNAPSHOT off and on change which reads wait and whether READPAST is
 * legal, so every statement runs under both.
 */
import { describeStoreContract } from '../store-contract.js';
import { describeFlowContract } from '../store-flow-contract.js';
import { describeHandlerTransactionContract } from '../store-handler-transaction.js';
import { describeEachMssqlDatabase, mssqlStoreTarget } from './mssql-databases.js';

describeEachMssqlDatabase('store contract', (db) => {
  describeStoreContract(mssqlStoreTarget(db));
  describeFlowContract(mssqlStoreTarget(db));
  describeHandlerTransactionContract(mssqlStoreTarget(db));
});
