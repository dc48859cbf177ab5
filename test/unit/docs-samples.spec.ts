import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { dirname, join, normalize } from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';
import { describe, expect, it } from 'vitest';

/**
 * Every TypeScript sample in README.md and docs/*.md is type-checked against the package's
 * source, so the guides cannot drift from the API. Two kinds of blocks:
 *
 * - A block whose first line is a file name comment (`// app.module.ts: …`) is a file of a small
 *   app: it compiles as pasted, with its own imports, and may import the other named files of the
 *   same page (`./orders.controller.js`). Nothing else is in scope.
 * - Any other block is a fragment: it may also use the names of FRAGMENT_SCOPE below, which stand
 *   for what the surrounding text says the reader already has (a producer, a connection, their
 *   own guard). Its imports, where it has them, must be right too.
 *
 * Each block is a module of its own (top-level await allowed), in a folder named after its page.
 */
const ROOT = fileURLToPath(new URL('../..', import.meta.url));

/** What a fragment may use without declaring it; a named file gets none of it. */
const FRAGMENT_SCOPE = `
import type * as queue from 'nestjs-sql-queue';
import type * as nest from '@nestjs/common';
import type * as mssql from 'mssql';
declare global {
  /** The injected producer. */
  const producer: queue.QueueProducer;
  /** The module's connection option, as in the quick start. */
  const connection: queue.SqlQueueConnection;
  /** A connection URL. */
  const url: string;
  /** The application's mssql pool. */
  const pool: mssql.ConnectionPool;
  /** A business record the example writes. */
  const order: { id: string; email: string };
  /** The application's own guard and the module it needs, for the dashboard. */
  class AdminGuard implements nest.CanActivate {
    canActivate(): boolean;
  }
  class AuthModule {}
  /** Some handler of the application. */
  class MyHandler {}
}
export {};
`;

interface Sample {
  page: string;
  line: number;
  name: string | null;
  code: string;
}

function pages(): string[] {
  const docs = readdirSync(join(ROOT, 'docs'))
    .filter((file) => file.endsWith('.md'))
    .map((file) => join('docs', file));
  return ['README.md', ...docs];
}

function samplesOf(page: string): Sample[] {
  const lines = readFileSync(join(ROOT, page), 'utf8').split('\n');
  const samples: Sample[] = [];
  for (let i = 0; i < lines.length; i++) {
    if (lines[i] !== '```ts') continue;
    const start = i + 1;
    let end = start;
    while (end < lines.length && !lines[end]!.startsWith('```')) end++;
    const code = lines.slice(start, end).join('\n');
    const name = /^\/\/ ([\w.-]+\.ts)\b/.exec(lines[start] ?? '')?.[1] ?? null;
    samples.push({ page, line: start, name, code });
    i = end;
  }
  return samples;
}

const ALL = pages().flatMap(samplesOf);

function fileOf(sample: Sample, index: number): string {
  const folder = join(ROOT, '.docs-samples', sample.page.replace(/\.md$/, '').replace(/[\\/]/g, '_'));
  return join(folder, sample.name ?? `sample-${index}-line-${sample.line}.ts`);
}

function compilerOptions(): ts.CompilerOptions {
  const config = ts.readConfigFile(join(ROOT, 'tsconfig.json'), ts.sys.readFile);
  const parsed = ts.parseJsonConfigFileContent(config.config, ts.sys, ROOT);
  // A sample shows the names it needs, not a finished program: a parameter it leaves unused is fine.
  return { ...parsed.options, noUnusedLocals: false, noUnusedParameters: false, noEmit: true };
}

/** Type-checks the samples as virtual files beside the repository (so node_modules resolve). */
function diagnose(samples: readonly Sample[], withScope: boolean): string[] {
  const options = compilerOptions();
  const virtual = new Map<string, string>();
  samples.forEach((sample) => {
    // `export {}` makes every block a module, as a pasted file in an ESM app is.
    virtual.set(fileOf(sample, ALL.indexOf(sample)), `${sample.code}\nexport {};\n`);
  });
  const scopeFile = join(ROOT, '.docs-samples', 'fragment-scope.d.ts');
  if (withScope) virtual.set(scopeFile, FRAGMENT_SCOPE);
  const host = ts.createCompilerHost(options);
  const readFile = host.readFile.bind(host);
  const fileExists = host.fileExists.bind(host);
  const getSourceFile = host.getSourceFile.bind(host);
  host.readFile = (file) => virtual.get(file) ?? readFile(file);
  host.fileExists = (file) => virtual.has(file) || fileExists(file);
  // Module resolution looks for the folder before the file; the virtual folders exist only here.
  const directoryExists = host.directoryExists?.bind(host);
  host.directoryExists = (folder) =>
    [...virtual.keys()].some((file) => file.startsWith(`${folder}/`)) || (directoryExists?.(folder) ?? true);
  host.getSourceFile = (file, language, onError, create) => {
    const text = virtual.get(file);
    if (text !== undefined) return ts.createSourceFile(file, text, language, true);
    return getSourceFile(file, language, onError, create);
  };
  const program = ts.createProgram([...virtual.keys()], options, host);
  return ts
    .getPreEmitDiagnostics(program)
    .filter((d) => d.file !== undefined && virtual.has(d.file.fileName) && d.file.fileName !== scopeFile)
    .map((d) => {
      const sample = samples.find((s) => fileOf(s, ALL.indexOf(s)) === d.file!.fileName)!;
      const { line } = d.file!.getLineAndCharacterOfPosition(d.start ?? 0);
      const message = ts.flattenDiagnosticMessageText(d.messageText, '\n');
      return `${sample.page}:${sample.line + line + 1}: ${message}`;
    });
}

describe('the code samples of README.md and docs/ compile against the package', () => {
  it('finds the samples (README, and more than one guide)', () => {
    expect(ALL.filter((s) => s.page === 'README.md').length).toBeGreaterThan(3);
    expect(new Set(ALL.map((s) => s.page)).size).toBeGreaterThan(3);
    // The quick start is a set of named files: what a newcomer pastes must compile as it is.
    expect(ALL.filter((s) => s.page === 'README.md' && s.name !== null).map((s) => s.name)).toEqual(
      expect.arrayContaining(['app.module.ts', 'orders.controller.ts', 'send-email.handler.ts']),
    );
  });

  it('no two named files of one page share a name', () => {
    const named = ALL.filter((s) => s.name !== null).map((s) => `${s.page}/${s.name}`);
    expect(named.length).toBe(new Set(named).size);
  });

  it('named files compile as pasted, with nothing else in scope', () => {
    expect(
      diagnose(
        ALL.filter((s) => s.name !== null),
        false,
      ),
    ).toEqual([]);
  }, 120_000);

  it('fragments compile with only the names their text presumes', () => {
    expect(diagnose(ALL, true)).toEqual([]);
  }, 120_000);

  it('the check is not blind: a sample with a wrong option name fails', () => {
    const wrong: Sample = {
      page: 'README.md',
      line: 0,
      name: null,
      code: "await producer.enqueue('emails', {}, { delay: 5 });",
    };
    ALL.push(wrong);
    try {
      const errors = diagnose([wrong], true);
      expect(errors.join('\n')).toMatch(/delay/);
    } finally {
      ALL.pop();
    }
  }, 120_000);
});

/** GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens. */
function anchorOf(heading: string): string {
  return heading
    .trim()
    .toLowerCase()
    .replace(/[^\p{L}\p{N}_\- ]/gu, '')
    .replace(/ /g, '-');
}

function anchorsOf(page: string): Set<string> {
  const anchors = new Set<string>();
  let inCode = false;
  for (const line of readFileSync(join(ROOT, page), 'utf8').split('\n')) {
    if (line.startsWith('```')) inCode = !inCode;
    const heading = inCode ? null : /^#+ (.*)$/.exec(line);
    if (heading) anchors.add(anchorOf(heading[1]!));
  }
  return anchors;
}

/** Every relative link of a page, outside code blocks: `[text](target)`. */
function linksOf(page: string): { line: number; target: string }[] {
  const links: { line: number; target: string }[] = [];
  let inCode = false;
  readFileSync(join(ROOT, page), 'utf8')
    .split('\n')
    .forEach((line, index) => {
      if (line.startsWith('```')) inCode = !inCode;
      if (inCode) return;
      for (const match of line.matchAll(/\]\(([^)\s]+)\)/g)) {
        const target = match[1]!;
        if (!/^[a-z]+:/i.test(target)) links.push({ line: index + 1, target });
      }
    });
  return links;
}

describe('the links of README.md and docs/ lead somewhere', () => {
  it('every relative link names a file that exists, and an anchor that file has', () => {
    const broken: string[] = [];
    for (const page of pages()) {
      for (const { line, target } of linksOf(page)) {
        const [path, anchor] = target.split('#') as [string, string | undefined];
        const file = path === '' ? page : normalize(join(dirname(page), path));
        if (!existsSync(join(ROOT, file))) broken.push(`${page}:${line}: ${target} (no file ${file})`);
        else if (anchor !== undefined && (!file.endsWith('.md') || !anchorsOf(file).has(anchor)))
          broken.push(`${page}:${line}: ${target} (no heading #${anchor} in ${file})`);
      }
    }
    expect(broken).toEqual([]);
  });

  it('the README links every guide, and every guide links back', () => {
    const guides = pages().filter((page) => page.startsWith('docs/'));
    const fromReadme = new Set(linksOf('README.md').map(({ target }) => target.split('#')[0]));
    expect(guides.filter((guide) => !fromReadme.has(guide))).toEqual([]);
    const orphans = guides.filter((guide) => !linksOf(guide).some(({ target }) => target.startsWith('../README.md')));
    expect(orphans).toEqual([]);
  });

  it('the anchor rule matches GitHub on our headings', () => {
    expect(anchorOf('Service Broker queues (SQL Server)')).toBe('service-broker-queues-sql-server');
    expect(anchorOf('The doorbell: instant wake-ups for table queues on SQL Server')).toBe(
      'the-doorbell-instant-wake-ups-for-table-queues-on-sql-server',
    );
    expect(anchorOf('Ordered groups (issue 11), 2026-12-01')).toBe('ordered-groups-issue-11-2026-12-01');
  });
});
