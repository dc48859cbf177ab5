import type { LoggerService } from '@nestjs/common';

/** A Nest logger that keeps lines for assertions and prints only errors when asked to. */
export class CaptureLogger implements LoggerService {
  readonly lines: { level: string; message: string }[] = [];

  constructor(private readonly echo = process.env.SQLQUEUE_TEST_LOGS === '1') {}

  private push(level: string, message: unknown): void {
    const text = String(message);
    this.lines.push({ level, message: text });
    if (this.echo) process.stderr.write(`[${level}] ${text}\n`);
  }

  log(message: unknown): void {
    this.push('log', message);
  }
  error(message: unknown): void {
    this.push('error', message);
  }
  warn(message: unknown): void {
    this.push('warn', message);
  }
  debug(message: unknown): void {
    this.push('debug', message);
  }
  verbose(message: unknown): void {
    this.push('verbose', message);
  }

  matching(pattern: RegExp): string[] {
    return this.lines.filter((line) => pattern.test(line.message)).map((line) => line.message);
  }
}
