// Receiving: receivers that move a queue's messages into its table queue's ordered groups, and the
// handler side of the moved jobs (decoding, Close, dead messages).
export { brokerDeadMessage, brokerJobHandler } from './broker.job.js';
export { endClosedConversation, endConversation } from './broker.receiver.queries.js';
export { BrokerReceiver } from './broker.receiver.js';
