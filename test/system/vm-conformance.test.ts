import { join } from 'node:path';
import { VmBackend } from '../../src/backends/index.ts';
import { describeBackendConformance, targetInDataDir } from '../conformance/backend-conformance.ts';
import { STORE_DIR } from '../support/platform.ts';

// A full Debian boot under TCG takes tens of seconds: the suite shares one VM across its checks,
// boots a second only to destroy it, and hibernates by checkpoint and restore, not by a boot.
describeBackendConformance(
  targetInDataDir(
    'vm',
    async (dataDir) => {
      const backend = await VmBackend.create({ kind: 'vm', dataDir, guestDir: join(STORE_DIR, 'guest') });
      return { backend, close: () => backend.close() };
    },
    { memoryMib: 512 },
  ),
);
