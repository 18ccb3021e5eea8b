import { randomBytes } from 'node:crypto';
import { rm } from 'node:fs/promises';
import { join } from 'node:path';
import { VmBackend } from '../../src/backends/index.ts';
import { describeBackendConformance } from '../conformance/backend-conformance.ts';
import { STORE_DIR, TEST_DATA_ROOT, busyboxSpecFactory } from '../support/platform.ts';

// Under TCG a boot takes seconds: the suite shares one VM across its read-only checks and boots
// another only where it must (concurrency, destroy).
describeBackendConformance({
  name: 'microvm',
  async open() {
    const dataDir = join(TEST_DATA_ROOT, `microvm-conformance-${randomBytes(4).toString('hex')}`);
    const backend = await VmBackend.create({ dataDir, guestDir: join(STORE_DIR, 'guest') });
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
