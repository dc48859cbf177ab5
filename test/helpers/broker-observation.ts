import type { BrokerRow, ResolvedBrokerOptions } from '../../lib/src/broker/broker.types.js';

/** The rows brokerObservationQuery returns for a database where the setup ran and all is well. */
export function healthyBrokerObservationRows(o: ResolvedBrokerOptions): BrokerRow[] {
  const rows: BrokerRow[] = [{ Kind: 'database', Name: 'appdb', Present: true, BrokerEnabled: true }];
  const queue = (schema: string, name: string): BrokerRow => ({
    Kind: 'queue',
    Schema: schema,
    Name: name,
    Present: true,
    ReceiveEnabled: true,
    EnqueueEnabled: true,
    ActivationEnabled: false,
    ActivationProcedure: null,
    PoisonHandling: false,
  });
  for (const q of o.queues) {
    rows.push(
      { Kind: 'messageType', Name: q.messageType, Present: true, Validation: q.format === 'xml' ? 'XML' : 'NONE' },
      { Kind: 'messageType', Name: q.closeMessageType, Present: true, Validation: 'NONE' },
      { Kind: 'contract', Name: q.contract, Present: true },
      queue(q.queue.schema, q.queue.name),
      queue(q.initiatorQueue.schema, q.initiatorQueue.name),
      {
        Kind: 'service',
        Name: q.service,
        Present: true,
        OnQueue: `${q.queue.schema}.${q.queue.name}`,
        HasContract: true,
      },
      {
        Kind: 'service',
        Name: q.initiatorService,
        Present: true,
        OnQueue: `${q.initiatorQueue.schema}.${q.initiatorQueue.name}`,
        HasContract: null,
      },
      ...[q.activationNotification, q.disabledNotification].map((name) => ({
        Kind: 'eventNotification',
        Schema: q.queue.schema,
        Parent: q.queue.name,
        Name: name,
        Present: true,
        TargetService: o.notificationService,
      })),
    );
  }
  rows.push(queue(o.notificationQueue.schema, o.notificationQueue.name), {
    Kind: 'service',
    Name: o.notificationService,
    Present: true,
    OnQueue: `${o.schema}.BrokerActivationQueue`,
    HasContract: true,
  });
  return rows;
}

/** Broker queue names set explicitly (another schema, URI-style Service Broker names): one fixture for the option and setup tests. */
export const CUSTOM_BROKER_NAMES = {
  queue: 'ops.Work',
  initiatorQueue: 'WorkReplies',
  service: '//example.com/work',
  initiatorService: '//example.com/work/client',
  contract: 'urn:work:contract',
  messageType: 'urn:work:message',
  closeMessageType: 'urn:work:close',
} as const;
