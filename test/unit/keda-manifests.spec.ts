/**
 * The KEDA manifests of the sample app (issue 26) against KEDA's own CRD schemas (the
 * @kubernetes-models/keda validators, generated from KEDA's CRDs; no cluster here), and against
 * what they must agree with: the sample's Deployment and queue, its maxReaders, the installed
 * function and procedure, and the library's scale-down delay.
 */
import { readFileSync } from 'node:fs';
import { ScaledObject } from '@kubernetes-models/keda/keda.sh/v1alpha1/ScaledObject';
import { TriggerAuthentication } from '@kubernetes-models/keda/keda.sh/v1alpha1/TriggerAuthentication';
import { describe, expect, it } from 'vitest';
import { parseAllDocuments } from 'yaml';
import { DEFAULT_SCALE_POLICY } from '../../lib/src/core/scaling/index.js';

type Manifest = { kind: string; metadata: { name: string }; spec?: Record<string, unknown> };

function manifests(file: string): Manifest[] {
  return parseAllDocuments(readFileSync(new URL(`../../sample-app/k8s/${file}`, import.meta.url), 'utf8')).map(
    (doc) => doc.toJS() as Manifest,
  );
}

const sampleMaxReaders = Number(
  /maxReaders: (\d+)/.exec(
    readFileSync(new URL('../../sample-app/src/emails/send-email.handler.ts', import.meta.url), 'utf8'),
  )![1],
);
const deployment = manifests('deployment.yaml').find((m) => m.kind === 'Deployment')!;

describe.each([
  {
    file: 'keda-postgres.yaml',
    type: 'postgresql',
    query: "SELECT sqlqueue.desired_readers('emails')",
    target: 'targetQueryValue',
  },
  {
    file: 'keda-mssql.yaml',
    type: 'mssql',
    query: "EXEC [sqlqueue].[DesiredReaders] @Queue = N'emails'",
    target: 'targetValue',
  },
])('sample-app/k8s/$file', ({ file, type, query, target }) => {
  const docs = manifests(file);
  const scaled = docs.find((m) => m.kind === 'ScaledObject')!;
  const auth = docs.find((m) => m.kind === 'TriggerAuthentication')!;

  it("validates against KEDA's ScaledObject and TriggerAuthentication schemas", () => {
    expect(() => new ScaledObject(scaled as never).validate()).not.toThrow();
    expect(() => new TriggerAuthentication(auth as never).validate()).not.toThrow();
  });

  it("scales the sample's Deployment from zero on the installed recommendation, at the queue's maxReaders a pod", () => {
    const spec = scaled.spec as {
      scaleTargetRef: { name: string };
      minReplicaCount: number;
      triggers: { type: string; metadata: Record<string, string>; authenticationRef: { name: string } }[];
      advanced: { horizontalPodAutoscalerConfig: { behavior: { scaleDown: { stabilizationWindowSeconds: number } } } };
    };
    expect(spec.scaleTargetRef.name).toBe(deployment.metadata.name);
    expect(spec.minReplicaCount).toBe(0);
    const [trigger] = spec.triggers;
    expect(trigger).toMatchObject({ type, authenticationRef: { name: auth.metadata.name } });
    expect(trigger!.metadata.query).toBe(query);
    expect(Number(trigger!.metadata[target])).toBe(sampleMaxReaders);
    expect(spec.advanced.horizontalPodAutoscalerConfig.behavior.scaleDown.stabilizationWindowSeconds).toBe(
      DEFAULT_SCALE_POLICY.scaleDownDelayMs / 1000,
    );
  });
});

it('the schema check is real: a ScaledObject without its target is refused', () => {
  expect(() => new ScaledObject({ metadata: { name: 'x' }, spec: { triggers: [] } } as never).validate()).toThrow(
    /scaleTargetRef/,
  );
});
