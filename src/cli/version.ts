import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { packageRoot } from '../backends/index.ts';

/** This sandgym's version, from its package.json. */
export const SANDGYM_VERSION = (
  JSON.parse(readFileSync(join(packageRoot(), 'package.json'), 'utf8')) as { version: string }
).version;
