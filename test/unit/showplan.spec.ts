import { describe, expect, it } from 'vitest';
import { describePlan, operatorsOn, parseXml, planOperators, statementPlans } from '../helpers/showplan.js';

// Shaped as SET STATISTICS XML returns a narrow ordered-TOP update (showplan schema 1.5x):
// Update <- Compute Scalar <- Top <- Nested Loops (Index Seek, Key Lookup).
const OBJECT = 'Database="[sqlqueue_test]" Schema="[t_plans_1]" Table="[Jobs]"';
const CLAIM_PLAN = `<?xml version="1.0" encoding="utf-16"?>
<ShowPlanXML xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" Version="1.564" Build="16.0.4135.4" xmlns="http://schemas.microsoft.com/sqlserver/2004/07/showplan">
  <BatchSequence><Batch><Statements>
    <StmtSimple StatementText="WITH candidate AS (SELECT TOP (@limit) * FROM [t_plans_1].[Jobs] WITH (UPDLOCK, READPAST) WHERE [RunAt] &lt;= SYSUTCDATETIME() ORDER BY [Priority] DESC) UPDATE candidate SET [State] = 'leased'" StatementId="3" StatementType="UPDATE" RetrievedFromCache="true">
      <StatementSetOptions ANSI_NULLS="true" QUOTED_IDENTIFIER="true" />
      <QueryPlan DegreeOfParallelism="1" CachedPlanSize="72">
        <RelOp NodeId="0" PhysicalOp="Clustered Index Update" LogicalOp="Update" EstimateRows="10">
          <OutputList />
          <RunTimeInformation><RunTimeCountersPerThread Thread="0" ActualRows="10" ActualExecutions="1" /></RunTimeInformation>
          <Update DMLRequestSort="0">
            <Object ${OBJECT} Index="[PK_Jobs]" IndexKind="Clustered" Storage="RowStore" />
            <Object ${OBJECT} Index="[IX_Jobs_Claim]" IndexKind="NonClustered" Filtered="1" Storage="RowStore" />
            <RelOp NodeId="1" PhysicalOp="Compute Scalar" LogicalOp="Compute Scalar">
              <ComputeScalar>
                <RelOp NodeId="2" PhysicalOp="Top" LogicalOp="Top">
                  <Top RowCount="0" IsPercent="0" WithTies="0">
                    <TopExpression><ScalarOperator ScalarString="[@limit]" /></TopExpression>
                    <RelOp NodeId="3" PhysicalOp="Nested Loops" LogicalOp="Inner Join">
                      <NestedLoops Optimized="0">
                        <RelOp NodeId="4" PhysicalOp="Index Seek" LogicalOp="Index Seek">
                          <IndexScan Ordered="1" ScanDirection="FORWARD" ForcedIndex="0">
                            <DefinedValues />
                            <Object ${OBJECT} Index="[IX_Jobs_Claim]" Filtered="1" IndexKind="NonClustered" Storage="RowStore" />
                            <SeekPredicates><SeekPredicateNew><SeekKeys><Prefix ScanType="EQ" /></SeekKeys></SeekPredicateNew></SeekPredicates>
                          </IndexScan>
                        </RelOp>
                        <RelOp NodeId="6" PhysicalOp="Clustered Index Seek" LogicalOp="Clustered Index Seek">
                          <IndexScan Lookup="1" Ordered="1" ScanDirection="FORWARD">
                            <Object ${OBJECT} Index="[PK_Jobs]" TableReferenceId="-1" IndexKind="Clustered" Storage="RowStore" />
                          </IndexScan>
                        </RelOp>
                      </NestedLoops>
                    </RelOp>
                  </Top>
                </RelOp>
              </ComputeScalar>
            </RelOp>
          </Update>
        </RelOp>
      </QueryPlan>
    </StmtSimple>
  </Statements></Batch></BatchSequence>
</ShowPlanXML>`;

// What a history-sized fallback looks like: a clustered scan feeding a TopN Sort, inside an IF.
const SCAN_PLAN = `<ShowPlanXML xmlns="http://schemas.microsoft.com/sqlserver/2004/07/showplan"><BatchSequence><Batch><Statements>
  <StmtCond StatementText="IF @x = 1" StatementType="COND"><Condition /><Then><Statements>
    <StmtSimple StatementText="SELECT TOP (@n) * FROM [t_plans_1].[Jobs] ORDER BY [RunAt]" StatementType="SELECT">
      <QueryPlan><RelOp PhysicalOp="Sort" LogicalOp="TopN Sort"><TopSort Rows="10">
        <RelOp PhysicalOp="Clustered Index Scan" LogicalOp="Clustered Index Scan"><IndexScan Ordered="0">
          <Object ${OBJECT} Index="[PK_Jobs]" IndexKind="Clustered" />
        </IndexScan></RelOp>
      </TopSort></RelOp></QueryPlan>
    </StmtSimple>
  </Statements></Then></StmtCond>
  <StmtSimple StatementText="SET TRANSACTION ISOLATION LEVEL READ COMMITTED" StatementType="SET ON/OFF" />
</Statements></Batch></BatchSequence></ShowPlanXML>`;

describe('showplan reader (the plan evidence of the SQL Server suite)', () => {
  it('builds the operator tree of a statement, each operator with its own objects', () => {
    const [claim] = statementPlans(CLAIM_PLAN);
    expect(claim!.type).toBe('UPDATE');
    expect(claim!.text).toContain('[RunAt] <= SYSUTCDATETIME()');
    expect(planOperators(claim!).map((op) => op.physicalOp)).toEqual([
      'Clustered Index Update',
      'Compute Scalar',
      'Top',
      'Nested Loops',
      'Index Seek',
      'Clustered Index Seek',
    ]);
    const [update, , , , seek, lookup] = planOperators(claim!);
    expect(update!.objects.map((o) => o.index)).toEqual(['PK_Jobs', 'IX_Jobs_Claim']);
    expect(seek!.objects).toEqual([
      { schema: 't_plans_1', table: 'Jobs', index: 'IX_Jobs_Claim', indexKind: 'NonClustered', lookup: false },
    ]);
    expect(lookup!.objects[0]).toMatchObject({ index: 'PK_Jobs', lookup: true });
    expect(operatorsOn(claim!, 't_plans_1', 'Jobs')).toHaveLength(3);
    expect(operatorsOn(claim!, 'other', 'Jobs')).toEqual([]);
  });

  it('finds statements nested in conditions, and statements without a plan', () => {
    const plans = statementPlans(SCAN_PLAN);
    expect(plans.map((p) => [p.type, p.root?.physicalOp ?? null])).toEqual([
      ['SELECT', 'Sort'],
      ['SET ON/OFF', null],
    ]);
    expect(planOperators(plans[0]!).map((op) => `${op.physicalOp}/${op.logicalOp}`)).toEqual([
      'Sort/TopN Sort',
      'Clustered Index Scan/Clustered Index Scan',
    ]);
  });

  it('describes a plan for failure messages', () => {
    const text = describePlan(statementPlans(CLAIM_PLAN)[0]!);
    expect(text).toContain('        Index Seek [t_plans_1].[Jobs].[IX_Jobs_Claim]');
    expect(text).toContain('Clustered Index Seek [t_plans_1].[Jobs].[PK_Jobs] (lookup)');
    expect(text).toContain('Nested Loops (Inner Join)');
  });

  it('decodes entities and refuses unbalanced XML', () => {
    expect(parseXml('<a b="x &lt; &amp; &#65; &#x42; &quot;y&quot;"/>').attributes.b).toBe('x < & A B "y"');
    expect(() => parseXml('<a><b></a>')).toThrow(/unbalanced/);
    expect(() => parseXml('<a><b>')).toThrow(/not one balanced document/);
  });
});
