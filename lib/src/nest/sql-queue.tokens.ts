/** The resolved runtime (store, wake-up bus, producer core) of one SqlQueueModule. */
export const SQL_QUEUE_RUNTIME = Symbol('SQL_QUEUE_RUNTIME');
