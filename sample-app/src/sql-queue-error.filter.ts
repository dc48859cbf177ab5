import { Catch, type ArgumentsHost, type ExceptionFilter } from '@nestjs/common';
import { HttpAdapterHost } from '@nestjs/core';
import { SqlQueueValidationError } from 'nestjs-sql-queue';

/** A refused argument (bad queue name, payload too large, …) is the client's error: 400, with the library's message. */
@Catch(SqlQueueValidationError)
export class SqlQueueValidationFilter implements ExceptionFilter {
  constructor(private readonly adapterHost: HttpAdapterHost) {}

  catch(error: SqlQueueValidationError, host: ArgumentsHost): void {
    const response = host.switchToHttp().getResponse<unknown>();
    this.adapterHost.httpAdapter.reply(
      response,
      { statusCode: 400, error: 'Bad Request', message: error.message },
      400,
    );
  }
}
