import { join } from 'node:path';
import { VmBackend } from '../../src/backends/index.ts';
import { describeBackendConformance, targetInDataDir } from '../conformance/backend-conformance.ts';
import { STORE_DIR } from '../support/platform.ts';

// Under TCG a boot takes seconds: the suite shares one VM across its checks and boots another
// only where it must (destroy); hibernation is a checkpoint and a restore, not a boot.
describeBackendConformance(
  targetInDataDir('microvm', async (dataDir) => {
    const backend = await VmBackend.create({ dataDir, guestDir: join(STORE_DIR, 'guest') });
    return { backend, close: () => backend.close() };
  }),
);
