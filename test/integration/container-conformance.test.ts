import { randomBytes } from 'node:crypto';
import { rm } from 'node:fs/promises';
import { join } from 'node:path';
import { ContainerBackend, type ContainerBackendOptions } from '../../src/backends/index.ts';
import { describeBackendConformance } from '../conformance/backend-conformance.ts';
import { TEST_DATA_ROOT, busyboxSpecFactory } from '../support/platform.ts';

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
      const spec = await busyboxSpecFactory();
      return {
        backend,
        spec,
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
