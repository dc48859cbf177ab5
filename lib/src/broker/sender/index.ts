// Sending: one long-lived dialog per group key with its close handshake and outbox, and the
// initiator-queue reader that ends our side of the dialogs targets end.
export { BrokerInitiatorReader } from './broker.initiator.js';
export { MSSQL_END_STATE_ERROR, MSSQL_HANDLE_NOT_FOUND } from './broker.sender.queries.js';
export { BrokerSender } from './broker.sender.js';
