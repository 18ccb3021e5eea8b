import { ContainerBackend, FnCallBackend } from '../../src/backends/index.ts';
import { describeBackendConformance, targetInDataDir } from '../conformance/backend-conformance.ts';

describeBackendConformance(
  targetInDataDir('fncall', async (dataDir) => {
    const containers = await ContainerBackend.create({ dataDir });
    const backend = new FnCallBackend(containers, { nodeId: 'local', workersPerEnvironment: 2 });
    return {
      backend,
      close: async () => {
        await backend.close();
        await containers.close();
      },
    };
  }),
);
