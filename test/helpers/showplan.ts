/**
 * Reads SQL Server's XML showplan (what SET STATISTICS XML ON returns, one document per
 * statement) into operator trees a test can assert on: which index each operator reads, and
 * whether a Sort or a scan is anywhere in the plan. Showplan is plain, well-formed XML
 * (elements and attributes, no text content a plan needs), so a small reader does, and no XML
 * package is added for tests.
 */

export interface XmlElement {
  /** Local name: showplan's default namespace is dropped. */
  name: string;
  attributes: Record<string, string>;
  children: XmlElement[];
}

const ENTITIES: Record<string, string> = { lt: '<', gt: '>', amp: '&', quot: '"', apos: "'" };

function decode(value: string): string {
  return value.replace(/&(#x[0-9a-f]+|#\d+|[a-z]+);/gi, (whole, entity: string) => {
    if (entity[0] === '#') {
      const code =
        entity[1] === 'x' || entity[1] === 'X' ? parseInt(entity.slice(2), 16) : parseInt(entity.slice(1), 10);
      return String.fromCodePoint(code);
    }
    return ENTITIES[entity] ?? whole;
  });
}

const localName = (name: string) => name.slice(name.indexOf(':') + 1);

const MARKUP =
  /<\?[\s\S]*?\?>|<!--[\s\S]*?-->|<!\[CDATA\[[\s\S]*?\]\]>|<(\/?)([A-Za-z_][\w.:-]*)((?:\s+[\w.:-]+\s*=\s*(?:"[^"]*"|'[^']*'))*)\s*(\/?)>/g;
const ATTRIBUTE = /([\w.:-]+)\s*=\s*(?:"([^"]*)"|'([^']*)')/g;

/** The document element of an XML text. Throws on unbalanced tags. */
export function parseXml(text: string): XmlElement {
  const root: XmlElement = { name: '#document', attributes: {}, children: [] };
  const open: XmlElement[] = [root];
  for (const match of text.matchAll(MARKUP)) {
    const [, closing, rawName, rawAttributes, selfClosing] = match;
    if (rawName === undefined) continue; // declaration, comment or CDATA
    const name = localName(rawName);
    if (closing) {
      const top = open.pop();
      if (!top || top === root || top.name !== name) throw new Error(`unbalanced </${rawName}> in XML`);
      continue;
    }
    const attributes: Record<string, string> = {};
    for (const [, key, double, single] of (rawAttributes ?? '').matchAll(ATTRIBUTE)) {
      attributes[localName(key!)] = decode(double ?? single ?? '');
    }
    const element: XmlElement = { name, attributes, children: [] };
    open[open.length - 1]!.children.push(element);
    if (!selfClosing) open.push(element);
  }
  if (open.length !== 1 || root.children.length !== 1) throw new Error('XML text is not one balanced document');
  return root.children[0]!;
}

/** Every descendant element named `name`, in document order; `stopAt` elements are not entered. */
function descendants(element: XmlElement, name: string, stopAt?: string): XmlElement[] {
  const found: XmlElement[] = [];
  for (const child of element.children) {
    if (child.name === name) found.push(child);
    if (child.name !== stopAt) found.push(...descendants(child, name, stopAt));
  }
  return found;
}

/** A table or index an operator reads or writes, brackets removed. */
export interface PlanObject {
  schema: string | null;
  table: string | null;
  index: string | null;
  indexKind: string | null;
  /** A key lookup: a Clustered Index Seek that fetches the rest of a row found on another index. */
  lookup: boolean;
}

export interface PlanOperator {
  physicalOp: string;
  logicalOp: string;
  /** The objects of this operator itself, not of the operators under it. */
  objects: PlanObject[];
  children: PlanOperator[];
}

export interface StatementPlan {
  type: string;
  text: string;
  root: PlanOperator | null;
}

const unbracket = (value: string | undefined) => (value === undefined ? null : value.replace(/^\[(.*)\]$/, '$1'));

/** The operators directly under `element`: RelOps reached without passing through another RelOp. */
function childOperators(element: XmlElement): PlanOperator[] {
  const operators: PlanOperator[] = [];
  for (const child of element.children) {
    if (child.name === 'RelOp') operators.push(toOperator(child));
    else operators.push(...childOperators(child));
  }
  return operators;
}

/** The Object elements of a RelOp itself (under its operator element, not under a nested RelOp). */
function ownObjects(relOp: XmlElement): PlanObject[] {
  const objects: PlanObject[] = [];
  const visit = (element: XmlElement, lookup: boolean) => {
    for (const child of element.children) {
      if (child.name === 'RelOp') continue;
      if (child.name === 'Object') {
        objects.push({
          schema: unbracket(child.attributes.Schema),
          table: unbracket(child.attributes.Table),
          index: unbracket(child.attributes.Index),
          indexKind: child.attributes.IndexKind ?? null,
          lookup,
        });
      }
      visit(child, lookup || (child.name === 'IndexScan' && child.attributes.Lookup === '1'));
    }
  };
  visit(relOp, false);
  return objects;
}

function toOperator(relOp: XmlElement): PlanOperator {
  return {
    physicalOp: relOp.attributes.PhysicalOp ?? '?',
    logicalOp: relOp.attributes.LogicalOp ?? '?',
    objects: ownObjects(relOp),
    children: childOperators(relOp),
  };
}

/** One entry per statement of a showplan document (StmtSimple, wherever it is nested). */
export function statementPlans(showplanXml: string): StatementPlan[] {
  return descendants(parseXml(showplanXml), 'StmtSimple').map((statement) => {
    const queryPlan = descendants(statement, 'QueryPlan', 'StmtSimple')[0];
    const [root] = queryPlan ? childOperators(queryPlan) : [];
    return {
      type: statement.attributes.StatementType ?? '?',
      text: statement.attributes.StatementText ?? '',
      root: root ?? null,
    };
  });
}

/** Every operator of a plan, parents before children. */
export function planOperators(plan: StatementPlan): PlanOperator[] {
  const all: PlanOperator[] = [];
  const walk = (op: PlanOperator) => {
    all.push(op);
    op.children.forEach(walk);
  };
  if (plan.root) walk(plan.root);
  return all;
}

/** Operators of a plan that touch `table` in `schema` (reads, writes or lookups). */
export function operatorsOn(plan: StatementPlan, schema: string, table: string): PlanOperator[] {
  return planOperators(plan).filter((op) => op.objects.some((o) => o.schema === schema && o.table === table));
}

/** The plan as indented lines, for failure messages: "Index Seek [s].[Jobs].[IX_Jobs_Claim]". */
export function describePlan(plan: StatementPlan): string {
  const lines = [`${plan.type}: ${plan.text.replace(/\s+/g, ' ').slice(0, 160)}`];
  const walk = (op: PlanOperator, depth: number) => {
    const objects = op.objects
      .map((o) => `[${o.schema}].[${o.table}]${o.index ? `.[${o.index}]` : ''}${o.lookup ? ' (lookup)' : ''}`)
      .join(', ');
    lines.push(
      `${'  '.repeat(depth + 1)}${op.physicalOp}${op.logicalOp !== op.physicalOp ? ` (${op.logicalOp})` : ''} ${objects}`.trimEnd(),
    );
    op.children.forEach((child) => walk(child, depth + 1));
  };
  if (plan.root) walk(plan.root, 0);
  return lines.join('\n');
}
