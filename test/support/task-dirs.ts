import { cp, mkdir, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';

/** The smallest Harbor task: write a file, and tests that check it (examples/tasks/hello-file). */
export const HELLO_TASK = resolve(import.meta.dirname, '..', '..', 'examples', 'tasks', 'hello-file');

/**
 * A copy of the hello-file task under `root` with the test's own files over it (a Dockerfile, a
 * task.toml, tests), each executable: a task shaped for one test, loaded like any task folder.
 */
export async function helloTaskWith(
  root: string,
  name: string,
  files: Record<string, string>,
): Promise<string> {
  const dir = join(root, 'tasks', `${name}-${Math.random().toString(36).slice(2, 8)}`);
  await mkdir(dir, { recursive: true });
  await cp(HELLO_TASK, dir, { recursive: true });
  for (const [path, content] of Object.entries(files)) {
    await mkdir(join(dir, path, '..'), { recursive: true });
    await writeFile(join(dir, path), content, { mode: 0o755 });
  }
  return dir;
}

/** A Dockerfile on the Debian base: `lines` after its FROM. */
export function debianDockerfile(...lines: string[]): string {
  return ['FROM debian:bookworm', ...lines, ''].join('\n');
}
