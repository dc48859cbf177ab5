/** What the engine logs through; Nest's Logger satisfies it, and so does a console wrapper. */
export interface QueueLogger {
  log(message: string): void;
  warn(message: string): void;
  error(message: string, stack?: string): void;
  debug?(message: string): void;
}

export const silentLogger: QueueLogger = {
  log: () => undefined,
  warn: () => undefined,
  error: () => undefined,
  debug: () => undefined,
};

/**
 * Logs a failure that repeats (the database is down) once when it starts, then at most every
 * `everyMs` with a count, and once more when it clears, instead of once per attempt.
 */
export class ThrottledErrorLog {
  private failingSince: number | null = null;
  private lastLoggedAt = 0;
  private suppressed = 0;

  constructor(
    private readonly logger: QueueLogger,
    private readonly what: string,
    private readonly now: () => number,
    private readonly everyMs = 30_000,
  ) {}

  failed(error: unknown, retryInMs: number): void {
    const t = this.now();
    const message = error instanceof Error ? error.message : String(error);
    if (this.failingSince === null) {
      this.failingSince = t;
      this.lastLoggedAt = t;
      this.logger.error(`${this.what} failed: ${message}; retrying in ${retryInMs} ms`, (error as Error)?.stack);
      return;
    }
    if (t - this.lastLoggedAt >= this.everyMs) {
      this.logger.error(
        `${this.what} still failing after ${Math.round((t - this.failingSince) / 1000)} s (${this.suppressed + 1} attempts since last report): ${message}`,
      );
      this.lastLoggedAt = t;
      this.suppressed = 0;
      return;
    }
    this.suppressed++;
  }

  succeeded(): void {
    if (this.failingSince === null) return;
    this.logger.log(`${this.what} recovered after ${Math.round((this.now() - this.failingSince) / 1000)} s`);
    this.failingSince = null;
    this.suppressed = 0;
  }

  get failing(): boolean {
    return this.failingSince !== null;
  }
}
