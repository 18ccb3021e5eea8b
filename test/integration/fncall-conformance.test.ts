import { randomBytes } from 'node:crypto';
import { rm } from 'node:fs/promises';
import { join } from 'node:path';
import { ContainerBackend, FnCallBackend } from '../../src/backends/index.ts';
import { newSandboxId } from '../../src/common/index.ts';
import { LayerStore } from '../../src/platform/index.ts';
import { describeBackendConformance } from '../conformance/backend-conformance.ts';
import { STORE_DIR, TEST_DATA_ROOT } from '../support/platform.ts';

describeBackendConformance({
  name: 'fncall',
  async open() {
    const dataDir = join(TEST_DATA_ROOT, `fncall-${randomBytes(4).toString('hex')}`);
    const containers = await ContainerBackend.create({ dataDir });
    const backend = new FnCallBackend(containers, { nodeId: 'local', workersPerEnvironment: 2 });
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
          await containers.close();
        } finally {
          await rm(dataDir, { recursive: true, force: true });
        }
      },
    };
  },
});
