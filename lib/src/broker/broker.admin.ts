import { brokerQueueFigures, conversationEndpointsByState } from './broker.admin.queries.js';
import { quoteBrokerObject } from './broker.names.js';
import type { BrokerDriver, ResolvedBrokerQueue } from './broker.types.js';

/** The figures of a broker queue and of this database's conversations. */
export class BrokerAdmin {
  constructor(private readonly driver: BrokerDriver) {}

  /** Messages waiting in the Service Broker queue (from metadata, never a scan). */
  async messagesWaiting(queue: ResolvedBrokerQueue): Promise<number> {
    const [row] = await this.driver.query<{ MessagesWaiting: number | string | null }>(brokerQueueFigures(), {
      queueObject: { type: 'nvarchar', value: quoteBrokerObject(queue.queue) },
    });
    return Number(row?.MessagesWaiting ?? 0);
  }

  /** This database's conversation endpoints by state_desc (CONVERSING, DISCONNECTED_INBOUND, CLOSED, …). */
  async conversationEndpointsByState(): Promise<Record<string, number>> {
    const rows = await this.driver.query<{ State: string; Count: number | string }>(conversationEndpointsByState());
    return Object.fromEntries(rows.map((row) => [String(row.State), Number(row.Count)]));
  }
}
