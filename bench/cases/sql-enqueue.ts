import pgLib from 'pg';
import { dropSchema, openStore, payload, perSecond, PG_URL, producerFor, schemaName, type Result } from '../common.js';
import { costPerJob, wireCounters, type DbCost } from '../db-cost.js';

/**
 * Enqueue from SQL (issue 25): one client calling `<schema>.enqueue(...)` in autocommit, one job a
 * call, against producer.enqueue from one sequential caller (README defaults), without and with an
 * idempotency key, alternated twice so drift hits both alike.
 */
export async function sqlEnqueueCase(scale: number): Promise<Result[]> {
  const schema = schemaName('sqlenqueue');
  const store = await openStore(PG_URL, schema, 10);
  const producer = producerFor(store);
  const client = new pgLib.Client({ connectionString: PG_URL });
  await client.connect();
  const total = Math.round(3_000 * scale);
  let serial = 0;
  try {
    const costs = new Map<string, DbCost>();
    const viaProducer = async (keyed: boolean) => {
      const before = wireCounters();
      const started = performance.now();
      for (let i = 0; i < total; i++) {
        const n = ++serial;
        await producer.enqueue('producer', payload(n), keyed ? { idempotencyKey: `k${n}` } : undefined);
      }
      const rate = perSecond(total, performance.now() - started);
      costs.set(`producer-${keyed}`, costPerJob(before, total));
      return rate;
    };
    const viaFunction = async (keyed: boolean) => {
      const text = `SELECT job_id FROM "${schema}".enqueue('function', $1::jsonb, idempotency_key => $2)`;
      const before = wireCounters();
      const started = performance.now();
      for (let i = 0; i < total; i++) {
        const n = ++serial;
        await client.query({ name: 'sql-enqueue', text, values: [JSON.stringify(payload(n)), keyed ? `k${n}` : null] });
      }
      const rate = perSecond(total, performance.now() - started);
      costs.set(`function-${keyed}`, costPerJob(before, total));
      return rate;
    };
    const results: Result[] = [];
    for (const keyed of [false, true]) {
      const ours: number[] = [];
      const producers: number[] = [];
      for (let round = 0; round < 2; round++) {
        producers.push(await viaProducer(keyed));
        ours.push(await viaFunction(keyed));
      }
      const mean = (values: number[]) => Math.round(values.reduce((a, b) => a + b, 0) / values.length);
      results.push({
        case: 'sql-enqueue',
        variant: `<schema>.enqueue(...), 1 client, sequential${keyed ? ', idempotency key' : ''}`,
        value: mean(ours),
        unit: 'jobs/s',
        reference: {
          name: `producer.enqueue, 1 caller, sequential${keyed ? ', idempotency key' : ''}`,
          value: mean(producers),
        },
        dbCost: costs.get(`function-${keyed}`),
      });
      results.push({
        case: 'sql-enqueue',
        variant: `producer.enqueue, 1 caller, sequential${keyed ? ', idempotency key' : ''} (README defaults)`,
        value: mean(producers),
        unit: 'jobs/s',
        dbCost: costs.get(`producer-${keyed}`),
      });
    }
    return results;
  } finally {
    await client.end();
    await store.close();
    await dropSchema(PG_URL, schema);
  }
}
