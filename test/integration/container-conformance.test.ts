import { ContainerBackend, type ContainerBackendOptions } from '../../src/backends/index.ts';
import { describeBackendConformance, targetInDataDir } from '../conformance/backend-conformance.ts';

// cold: every sandbox a new container; warm: every sandbox a pooled shell given its layers, and
// every destroyed one scrubbed and pooled again
const variants: Array<{ name: string; options: Partial<ContainerBackendOptions> }> = [
  { name: 'container', options: {} },
  { name: 'container (warm pool)', options: { warmPool: { latency: 2 } } },
];

for (const variant of variants) {
  describeBackendConformance(
    targetInDataDir(variant.name, async (dataDir) => {
      const backend = await ContainerBackend.create({ dataDir, ...variant.options });
      await backend.warmPoolFilled();
      return { backend, close: () => backend.close() };
    }),
  );
}
