// Setup: the DDL and grants of the broker objects (named by broker.names.ts), and the boot check
// that observes what exists and creates, prints or refuses.
export {
  applyBrokerSetup,
  assessBrokerSetup,
  brokerBootDecision,
  brokerEventNotificationBatch,
  brokerGrantsScript,
  brokerObservationQuery,
  brokerSetupScript,
  parseBrokerObservation,
} from './broker.setup.js';
