import { randomBytes } from 'node:crypto';
import { rm } from 'node:fs/promises';
import { join } from 'node:path';
import { ContainerBackend, type ContainerBackendOptions } from '../../src/backends/index.ts';
import { newSandboxId } from '../../src/common/index.ts';
import { LayerStore } from '../../src/platform/index.ts';
import { describeBackendConformance } from '../conformance/backend-conformance.ts';
import { STORE_DIR, TEST_DATA_ROOT } from '../support/platform.ts';

// cold: every sandbox a new container; warm: every sandbox a pooled shell given its layers, and
// every destroyed one scrubbed and pooled again
const variants: Array<{ name: string; options: Partial<ContainerBackendOptions> }> = [
  { name: 'container', options: {} },
  { name: 'container (warm pool)', options: { warmPool: { latency: 2 } } },
];

for (const variant of variants) {
  describeBackendConformance({
    name: variant.name,
    async open() {
      const dataDir = join(TEST_DATA_ROOT, `conformance-${randomBytes(4).toString('hex')}`);
      const backend = await ContainerBackend.create({ dataDir, ...variant.options });
      await backend.warmPoolFilled();
      const store = await LayerStore.open(STORE_DIR);
      const layers = await store.layerImages(await store.getEnvironment('busybox:latest'));
      return {
        backend,
        spec: () => ({
          id: newSandboxId('local'),
          layers,
          env: {},
          workdir: '/',
          resources: { cpu: 1, memoryMib: 128, pids: 128, outputCapBytes: 1 << 20 },
          qos: 'latency' as const,
          labels: {},
        }),
        async dispose() {
          try {
            await backend.close();
          } finally {
            await rm(dataDir, { recursive: true, force: true });
          }
        },
      };
    },
  });
}
