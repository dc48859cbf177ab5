import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const LIB = fileURLToPath(new URL('../../lib/src', import.meta.url));

function sourceFiles(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    return statSync(path).isDirectory() ? sourceFiles(path) : path.endsWith('.ts') ? [path] : [];
  });
}

/** Runtime imports only: `import type` is erased at compile time and loads nothing. */
function importsOf(file: string): string[] {
  const text = readFileSync(file, 'utf8').replace(/^import type [^;]*;$/gm, '');
  return [...text.matchAll(/(?:import|export)\s[^'"]*?from\s+['"]([^'"]+)['"]|import\(\s*['"]([^'"]+)['"]\s*\)/g)].map(
    (m) => (m[1] ?? m[2])!,
  );
}

/** Which top-level folder of lib/src an import lands in, or the package name for externals. */
function target(file: string, specifier: string): string {
  if (!specifier.startsWith('.'))
    return specifier.startsWith('@') ? specifier.split('/').slice(0, 2).join('/') : specifier.split('/')[0]!;
  const resolved = relative(LIB, join(file, '..', specifier));
  return `lib:${resolved.split('/')[0]}`;
}

const files = sourceFiles(LIB).map((file) => ({
  file,
  area: relative(LIB, file).split('/')[0]!,
  sub: relative(LIB, file).split('/')[1] ?? '',
  targets: importsOf(file).map((spec) => target(file, spec)),
}));

describe('layering: dependency arrows point down only', () => {
  it('finds the source tree', () => {
    expect(files.some((f) => f.area === 'core')).toBe(true);
  });

  it('core imports nothing but core, Node built-ins and `cron`', () => {
    for (const f of files.filter((x) => x.area === 'core')) {
      // `cron` (already brought by @nestjs/schedule): schedules read cron expressions with it, never a hand-written parser.
      const outside = f.targets.filter((t) => t !== 'lib:core' && !t.startsWith('node:') && t !== 'cron');
      expect(outside, relative(LIB, f.file)).toEqual([]);
    }
  });

  it('store imports core and its own driver only, never Nest', () => {
    for (const f of files.filter((x) => x.area === 'store')) {
      const bad = f.targets.filter((t) => t.startsWith('@nestjs') || t === 'lib:nest' || t === 'lib:broker');
      expect(bad, relative(LIB, f.file)).toEqual([]);
    }
  });

  it('only store/mssql and broker import mssql; only store/postgres imports pg and PGlite', () => {
    for (const f of files) {
      const where = relative(LIB, f.file);
      if (f.targets.includes('mssql'))
        expect(where.startsWith('store/mssql/') || f.area === 'broker', where).toBe(true);
      if (f.targets.includes('pg') || f.targets.includes('@electric-sql/pglite')) {
        expect(where.startsWith('store/postgres/'), where).toBe(true);
      }
    }
  });

  it('Terminus stays behind the health entry point (an optional peer)', () => {
    for (const f of files.filter((x) => !relative(LIB, x.file).includes('health'))) {
      expect(f.targets.includes('@nestjs/terminus'), relative(LIB, f.file)).toBe(false);
    }
  });

  it('prom-client stays behind the prometheus entry point (an optional peer)', () => {
    for (const f of files.filter((x) => !relative(LIB, x.file).includes('prometheus'))) {
      expect(f.targets.includes('prom-client'), relative(LIB, f.file)).toBe(false);
    }
  });

  it('dashboard builds on nest and core only: never a store, the broker or a driver', () => {
    const dashboard = files.filter((x) => x.area === 'dashboard');
    expect(dashboard.length).toBeGreaterThan(3);
    for (const f of dashboard) {
      const allowed = ['lib:core', 'lib:nest', 'lib:dashboard', '@nestjs/common', '@nestjs/core'];
      const outside = f.targets.filter((t) => !allowed.includes(t) && !t.startsWith('node:'));
      expect(outside, relative(LIB, f.file)).toEqual([]);
    }
  });

  it('only the dashboard entry point imports the dashboard', () => {
    for (const f of files.filter((x) => x.area !== 'dashboard' && x.area !== 'dashboard.ts')) {
      expect(f.targets.includes('lib:dashboard'), relative(LIB, f.file)).toBe(false);
    }
  });

  it('the main entry point does not reach Terminus or prom-client through its imports', () => {
    const byPath = new Map(files.map((f) => [f.file, f]));
    const seen = new Set<string>();
    const visit = (file: string): void => {
      if (seen.has(file)) return;
      seen.add(file);
      for (const spec of importsOf(file).filter((s) => s.startsWith('.'))) {
        const next = join(file, '..', spec.replace(/\.js$/, '.ts'));
        if (byPath.has(next)) visit(next);
      }
    };
    visit(join(LIB, 'index.ts'));
    for (const file of seen) {
      const f = byPath.get(file)!;
      const where = relative(LIB, file);
      expect(
        f.targets.filter((t) => t === '@nestjs/terminus' || t === 'prom-client'),
        where,
      ).toEqual([]);
    }
    expect(seen.size).toBeGreaterThan(10);
  });

  it('only lib/src/tracing imports @opentelemetry/api (an optional peer), and tracing builds on core only', () => {
    const tracing = files.filter((x) => x.area === 'tracing');
    expect(tracing.length).toBeGreaterThan(1);
    for (const f of files) {
      if (f.targets.includes('@opentelemetry/api')) expect(f.area, relative(LIB, f.file)).toBe('tracing');
    }
    for (const f of tracing) {
      const outside = f.targets.filter((t) => !['lib:core', 'lib:tracing', '@opentelemetry/api'].includes(t));
      expect(outside, relative(LIB, f.file)).toEqual([]);
    }
  });

  it('no entry point loads @opentelemetry/api but through import(), so an app without it boots', () => {
    // Static imports only: what loading an entry point loads before any code runs.
    const staticImports = (file: string) =>
      [...readFileSync(file, 'utf8').matchAll(/^(?:import|export)\s(?!type\s)[^'"]*?from\s+['"]([^'"]+)['"]/gm)].map(
        (m) => m[1]!,
      );
    const seen = new Set<string>();
    const reached: string[] = [];
    const visit = (file: string): void => {
      if (seen.has(file)) return;
      seen.add(file);
      for (const spec of staticImports(file)) {
        if (spec.startsWith('.')) visit(join(file, '..', spec.replace(/\.js$/, '.ts')));
        else if (spec.startsWith('@opentelemetry/')) reached.push(`${relative(LIB, file)} imports ${spec}`);
      }
    };
    for (const entry of ['index.ts', 'health.ts', 'prometheus.ts', 'dashboard.ts', 'cli.ts']) visit(join(LIB, entry));
    expect(seen.has(join(LIB, 'tracing/tracing.loader.ts'))).toBe(true);
    expect(reached).toEqual([]);
  });

  it('the PGlite path loads no `pg`: embedded PostgreSQL needs only @electric-sql/pglite', () => {
    const byPath = new Map(files.map((f) => [relative(LIB, f.file), f]));
    const seen = new Set<string>();
    const visit = (path: string): string[] => {
      if (seen.has(path)) return [];
      seen.add(path);
      const f = byPath.get(path);
      if (!f) return [];
      return importsOf(f.file).flatMap((spec) =>
        spec.startsWith('.') ? visit(relative(LIB, join(f.file, '..', spec)).replace(/\.js$/, '.ts')) : [spec],
      );
    };
    const externals = [...visit('store/postgres/postgres.store.ts'), ...visit('store/postgres/postgres.driver.ts')];
    expect(externals).not.toContain('pg');
  });

  it('relative imports are ESM-clean (end in .js)', () => {
    for (const f of files) {
      for (const spec of importsOf(f.file).filter((s) => s.startsWith('.'))) {
        expect(spec.endsWith('.js'), `${relative(LIB, f.file)} imports ${spec}`).toBe(true);
      }
    }
  });
});

/** Every import of a file (type-only ones too, unless `runtimeOnly`), resolved to the lib file it names. */
function localImportsOf(file: string, runtimeOnly = false): string[] {
  const source = readFileSync(file, 'utf8');
  const text = runtimeOnly ? source.replace(/^(?:import|export) type [^;]*;$/gm, '') : source;
  const specs = [
    ...text.matchAll(/(?:import|export)\s[^'"]*?from\s+['"](\.[^'"]+)['"]|import\(\s*['"](\.[^'"]+)['"]\s*\)/g),
  ].map((m) => (m[1] ?? m[2])!);
  return specs.map((spec) => join(file, '..', spec.replace(/\.js$/, '.ts')));
}

/** The capability folder a lib file is in (`core/consumer`, `broker/sender`, …), or null at an area's root. */
function capabilityOf(file: string): string | null {
  const parts = relative(LIB, file).split('/');
  return ['core', 'broker'].includes(parts[0]!) && parts.length > 2 ? `${parts[0]}/${parts[1]}` : null;
}

/** Strongly connected components of more than one node (or a node importing itself): the cycles. */
function cycles(graph: Map<string, Set<string>>): string[][] {
  let index = 0;
  const order = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const found: string[][] = [];
  const visit = (node: string): void => {
    order.set(node, index);
    low.set(node, index++);
    stack.push(node);
    onStack.add(node);
    for (const next of graph.get(node) ?? []) {
      if (!order.has(next)) {
        visit(next);
        low.set(node, Math.min(low.get(node)!, low.get(next)!));
      } else if (onStack.has(next)) low.set(node, Math.min(low.get(node)!, order.get(next)!));
    }
    if (low.get(node) === order.get(node)) {
      const component: string[] = [];
      let member: string;
      do {
        member = stack.pop()!;
        onStack.delete(member);
        component.push(member);
      } while (member !== node);
      if (component.length > 1 || graph.get(node)?.has(node)) found.push(component.sort());
    }
  };
  for (const node of graph.keys()) if (!order.has(node)) visit(node);
  return found;
}

describe('layout by capability (issue 22)', () => {
  const all = sourceFiles(LIB);
  const folders = [...new Set(all.map(capabilityOf).filter((c): c is string => c !== null))].sort();

  it('core/ and broker/ are split into capability folders, each with an index of what it offers', () => {
    expect(folders).toEqual(
      expect.arrayContaining([
        'core/consumer',
        'core/producer',
        'core/schedules',
        'core/throughput',
        'core/metrics',
        'broker/reader',
        'broker/sender',
        'broker/activation',
        'broker/setup',
        'broker/driver',
      ]),
    );
    for (const folder of folders) expect(statSync(join(LIB, folder, 'index.ts')).isFile(), folder).toBe(true);
    // A folder past about twenty files splits further (style.md).
    for (const area of ['core', 'broker', ...folders]) {
      const direct = readdirSync(join(LIB, area)).filter((name) => name.endsWith('.ts'));
      expect(direct.length, `${area} holds ${direct.length} files`).toBeLessThanOrEqual(20);
    }
  });

  it("outside a capability folder, lib code imports only that folder's index", () => {
    const reachedInside: string[] = [];
    for (const file of all) {
      for (const target of localImportsOf(file)) {
        const folder = capabilityOf(target);
        if (folder === null || capabilityOf(file) === folder) continue;
        if (relative(join(LIB, folder), target) !== 'index.ts') {
          reachedInside.push(`${relative(LIB, file)} -> ${relative(LIB, target)}`);
        }
      }
    }
    expect(reachedInside).toEqual([]);
  });

  it('the root files of core import no capability folder but for types', () => {
    for (const file of all.filter((f) => relative(LIB, f).split('/').length === 2 && f.includes('/core/'))) {
      const runtime = importsOf(file)
        .filter((spec) => spec.startsWith('.'))
        .map((spec) => join(file, '..', spec.replace(/\.js$/, '.ts')))
        .filter((target) => capabilityOf(target) !== null);
      expect(
        runtime.map((t) => relative(LIB, t)),
        relative(LIB, file),
      ).toEqual([]);
    }
  });

  it('no import cycle between files (type-only imports are erased: a port may name its capability)', () => {
    const graph = new Map(
      all.map((file) => [relative(LIB, file), new Set(localImportsOf(file, true).map((t) => relative(LIB, t)))]),
    );
    expect(cycles(graph)).toEqual([]);
  });

  it('no import cycle between capability folders, type-only imports included', () => {
    const graph = new Map<string, Set<string>>(folders.map((folder) => [folder, new Set()]));
    for (const file of all) {
      const from = capabilityOf(file);
      if (from === null) continue;
      for (const target of localImportsOf(file)) {
        const to = capabilityOf(target);
        if (to !== null && to !== from) graph.get(from)!.add(to);
      }
    }
    expect(cycles(graph)).toEqual([]);
  });

  it('the cycle check finds a cycle (it is not vacuous)', () => {
    const graph = new Map([
      ['a', new Set(['b'])],
      ['b', new Set(['c'])],
      ['c', new Set(['a'])],
      ['d', new Set(['a'])],
    ]);
    expect(cycles(graph)).toEqual([['a', 'b', 'c']]);
  });

  it('SQL statements are written only in store/ and broker/', () => {
    const statement =
      /\b(?:SELECT\s+[\w@*[(]|INSERT\s+INTO|DELETE\s+FROM|UPDATE\s+\S+\s+SET|CREATE\s+(?:TABLE|INDEX|QUEUE)|BEGIN\s+TRAN)/;
    for (const file of all.filter((f) => !['store', 'broker'].includes(relative(LIB, f).split('/')[0]!))) {
      // Strings only: a comment may name a statement.
      const strings = [...readFileSync(file, 'utf8').matchAll(/`[^`]*`|'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*"/g)].map(
        (m) => m[0],
      );
      expect(
        strings.filter((s) => statement.test(s)),
        relative(LIB, file),
      ).toEqual([]);
    }
  });
});
