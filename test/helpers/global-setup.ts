import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));

/**
 * Child-process tests (two applications, failure drills) run real Node processes. They run
 * the current TypeScript source compiled once per test run with tsc, so decorator metadata is
 * emitted exactly as in a user's build. Incremental: unchanged sources compile in ~1 s.
 */
export default function setup(): void {
  const tsc = `${ROOT}/node_modules/typescript/bin/tsc`;
  if (!existsSync(tsc)) throw new Error('typescript is not installed: run npm ci');
  const result = spawnSync(process.execPath, [tsc, '-p', 'test/workers/tsconfig.json'], {
    cwd: ROOT,
    encoding: 'utf8',
  });
  if (result.status !== 0) {
    throw new Error(`compiling test workers failed:\n${result.stdout}\n${result.stderr}`);
  }
}
