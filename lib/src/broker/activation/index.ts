// Activation: the consumer of this process's broker queues (receivers between min and max, the
// initiator readers), the QUEUE_ACTIVATION listener with its slow poll, and the doorbell.
export { BrokerConsumer } from './broker.consumer.js';
export { BrokerDoorbell } from './broker.doorbell.js';
export { readBrokerQueueHealth, readBrokerQueueLocks } from './broker.listener.queries.js';
