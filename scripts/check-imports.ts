import { resolve } from 'node:path';
import { checkImports } from './import-rules.ts';

// Lint step: fails on imports that go the wrong way between layers, and on cycles.
const problems = checkImports(resolve(import.meta.dirname, '..', '..'));
if (problems.length > 0) {
  console.error(`check-imports: ${problems.length} problem(s)\n${problems.join('\n')}`);
  process.exit(1);
}
console.error('check-imports: layers and cycles ok');
