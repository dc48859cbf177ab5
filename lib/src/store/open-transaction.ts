/** A transaction held open across awaits, from a driver that offers only `transaction(work)`. */
export interface OpenTransaction<C> {
  client: C;
  /** Ends `work` normally: the driver commits; rejects with the commit's error. */
  commit(): Promise<void>;
  /** Ends `work` with an error: the driver rolls back; never rejects. */
  rollback(): Promise<void>;
}

const ROLLBACK = Symbol('rollback');

/**
 * Runs `transaction` with a `work` that waits until commit() or rollback() is called, so the
 * transaction spans a handler's run. Rejects if the transaction could not be opened.
 */
export function openTransaction<C>(
  transaction: (work: (client: C) => Promise<void>) => Promise<void>,
): Promise<OpenTransaction<C>> {
  return new Promise((resolveOpened, rejectOpened) => {
    let end!: (decision: 'commit' | typeof ROLLBACK) => void;
    const decided = new Promise<'commit' | typeof ROLLBACK>((resolve) => (end = resolve));
    let opened = false;
    let rolledBack = false;
    const finished = transaction(async (client) => {
      opened = true;
      resolveOpened({
        client,
        commit: async () => {
          if (rolledBack) throw new Error('the transaction was already rolled back: nothing to commit');
          end('commit');
          await finished;
        },
        rollback: async () => {
          rolledBack = true;
          end(ROLLBACK);
          await finished.catch(() => undefined);
        },
      });
      if ((await decided) === ROLLBACK) throw ROLLBACK;
    });
    finished.catch((error: unknown) => {
      if (!opened) rejectOpened(error);
    });
  });
}
