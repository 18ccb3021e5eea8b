import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { parseAllDocuments } from 'yaml';
import { DaemonSet, Deployment, StatefulSet } from 'kubernetes-models/apps/v1';
import { Namespace, Secret, Service } from 'kubernetes-models/v1';
import { CONTROLLER_COMMAND, NODE_COMMAND } from '../../src/cli/commands/cluster.ts';
import { NODE_DRAIN_COMMAND } from '../../src/cli/commands/node-drain.ts';
import { parseCommand } from '../../src/cli/command-spec.ts';

const DIR = 'deploy/kubernetes';

interface Manifest {
  apiVersion: string;
  kind: string;
  metadata: { name: string; namespace?: string; labels?: Record<string, string> };
  spec?: Record<string, unknown>;
  [key: string]: unknown;
}

interface PodSpec {
  hostNetwork?: boolean;
  hostPID?: boolean;
  containers: {
    name: string;
    args?: string[];
    command?: string[];
    securityContext?: { privileged?: boolean };
    env?: { name: string; valueFrom?: { secretKeyRef?: { name: string; key: string } } }[];
    lifecycle?: { preStop?: { exec?: { command?: string[] } } };
    volumeMounts?: { name: string; mountPath: string }[];
  }[];
  volumes?: { name: string; hostPath?: { path: string }; secret?: { secretName: string } }[];
}

function manifests(): { file: string; doc: Manifest }[] {
  return readdirSync(DIR)
    .filter((file) => file.endsWith('.yaml'))
    .sort()
    .flatMap((file) =>
      parseAllDocuments(readFileSync(join(DIR, file), 'utf8')).map((parsed) => {
        expect(parsed.errors, `${file} parses as YAML`).toEqual([]);
        return { file, doc: parsed.toJS() as Manifest };
      }),
    );
}

/** The kubernetes-models classes (the Kubernetes API's own OpenAPI schemas) of the kinds used. */
const MODELS: Record<string, new (data: never) => { validate(): void }> = {
  'v1/Namespace': Namespace,
  'v1/Secret': Secret,
  'v1/Service': Service,
  'apps/v1/DaemonSet': DaemonSet,
  'apps/v1/Deployment': Deployment,
  'apps/v1/StatefulSet': StatefulSet,
};

function modelOf(doc: Manifest): Promise<{ validate(): void }> {
  const Model = MODELS[`${doc.apiVersion}/${doc.kind}`];
  if (!Model) throw new Error(`${doc.apiVersion} ${doc.kind} has no schema here: add its model to MODELS`);
  return Promise.resolve(new Model(doc as never));
}

const byKind = (all: { doc: Manifest }[], kind: string) =>
  all.map((m) => m.doc).filter((d) => d.kind === kind);
const podSpecOf = (doc: Manifest): PodSpec => (doc.spec as { template: { spec: PodSpec } }).template.spec;

describe('the Kubernetes manifests in deploy/kubernetes', () => {
  const all = manifests();

  it('validate against the Kubernetes API schema, each in the sandgym namespace', async () => {
    expect(all.length).toBeGreaterThan(5);
    for (const { file, doc } of all) {
      const model = await modelOf(doc);
      expect(() => model.validate(), `${file}: ${doc.kind} ${doc.metadata.name}`).not.toThrow();
      if (doc.kind !== 'Namespace') expect(doc.metadata.namespace, `${file}: ${doc.kind}`).toBe('sandgym');
    }
  });

  it('fail the check for a manifest with a wrong field type', async () => {
    const daemonSet = structuredClone(byKind(all, 'DaemonSet')[0]!);
    (podSpecOf(daemonSet) as unknown as { hostPID: string }).hostPID = 'yes';
    await expect(modelOf(daemonSet).then((m) => m.validate())).rejects.toThrow(/hostPID/);
  });

  it('run the node agent as a privileged DaemonSet with the host paths it needs', () => {
    const [node] = byKind(all, 'DaemonSet');
    const spec = podSpecOf(node!);
    const [container] = spec.containers;
    expect(container!.securityContext?.privileged).toBe(true);
    expect(spec.hostNetwork && spec.hostPID).toBe(true);
    const hostPaths = (spec.volumes ?? []).flatMap((v) => (v.hostPath ? [v.hostPath.path] : []));
    expect(hostPaths).toEqual(expect.arrayContaining(['/sys/fs/cgroup', '/dev', '/var/lib/sandgym']));
    for (const mount of container!.volumeMounts ?? [])
      expect(
        spec.volumes?.map((v) => v.name),
        `volume of ${mount.mountPath}`,
      ).toContain(mount.name);
  });

  it('give the sandgym commands only options they accept', () => {
    const commands = { node: NODE_COMMAND, controller: CONTROLLER_COMMAND } as const;
    const workloads = [...byKind(all, 'DaemonSet'), ...byKind(all, 'Deployment')];
    const seen = new Set<string>();
    for (const workload of workloads) {
      for (const container of podSpecOf(workload).containers) {
        const [command, ...args] = container.args ?? [];
        if (command !== 'node' && command !== 'controller') continue;
        seen.add(command);
        expect(() => parseCommand(commands[command], args), `${workload.metadata.name}`).not.toThrow();
        const preStop = container.lifecycle?.preStop?.exec?.command;
        if (preStop) {
          expect(preStop.slice(0, 3)).toEqual(['sandgym', 'node', 'drain']);
          expect(() => parseCommand(NODE_DRAIN_COMMAND, preStop.slice(3))).not.toThrow();
        }
        // the control plane runs on etcd and TLS
        expect(args.some((arg) => arg.startsWith('--etcd='))).toBe(true);
        expect(args.some((arg) => arg.startsWith('--tls-cert='))).toBe(true);
      }
    }
    expect([...seen].sort()).toEqual(['controller', 'node']);
  });

  it('select pods that exist, and refer to Secrets that are defined or documented', () => {
    const workloads = [
      ...byKind(all, 'DaemonSet'),
      ...byKind(all, 'Deployment'),
      ...byKind(all, 'StatefulSet'),
    ];
    for (const service of byKind(all, 'Service')) {
      const selector = (service.spec as { selector: Record<string, string> }).selector;
      const matched = workloads.filter((w) => {
        const labels = (w.spec as { template: { metadata: { labels: Record<string, string> } } }).template
          .metadata.labels;
        return Object.entries(selector).every(([key, value]) => labels[key] === value);
      });
      expect(matched.length, `Service ${service.metadata.name} selects a workload`).toBe(1);
    }
    const secrets = new Map(
      byKind(all, 'Secret').map((s) => [
        s.metadata.name,
        Object.keys((s as { stringData?: object }).stringData ?? {}),
      ]),
    );
    // made from `sandgym certs` output with kubectl, as docs/cluster.md says
    const documented = new Set(['sandgym-tls']);
    for (const workload of workloads) {
      const spec = podSpecOf(workload);
      for (const volume of spec.volumes ?? []) {
        const name = volume.secret?.secretName;
        if (name) expect(secrets.has(name) || documented.has(name), `Secret ${name}`).toBe(true);
      }
      for (const variable of spec.containers.flatMap((c) => c.env ?? [])) {
        const ref = variable.valueFrom?.secretKeyRef;
        if (ref) expect(secrets.get(ref.name), `Secret ${ref.name}`).toContain(ref.key);
      }
    }
    expect(readFileSync('docs/cluster.md', 'utf8')).toContain('sandgym-tls');
  });
});
