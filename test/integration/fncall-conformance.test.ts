import { randomBytes } from 'node:crypto';
import { rm } from 'node:fs/promises';
import { join } from 'node:path';
import { ContainerBackend, FnCallBackend } from '../../src/backends/index.ts';
import { describeBackendConformance } from '../conformance/backend-conformance.ts';
import { TEST_DATA_ROOT, busyboxSpecFactory } from '../support/platform.ts';

describeBackendConformance({
  name: 'fncall',
  async open() {
    const dataDir = join(TEST_DATA_ROOT, `fncall-${randomBytes(4).toString('hex')}`);
    const containers = await ContainerBackend.create({ dataDir });
    const backend = new FnCallBackend(containers, { nodeId: 'local', workersPerEnvironment: 2 });
    const spec = await busyboxSpecFactory();
    return {
      backend,
      spec,
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
