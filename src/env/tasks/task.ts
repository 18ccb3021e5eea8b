/** A task, whatever format it came in: what the agent is told, where it runs, how it is graded. */
export interface Task {
  id: string;
  format: 'harbor';
  dir: string;
  instruction: string;
  /** The Dockerfile that builds the task's environment, and its build context. */
  dockerfile: string;
  context: string;
  resources: { cpu: number; memoryMib: number };
  env: Record<string, string>;
  agentTimeoutMs: number;
  verifierTimeoutMs: number;
  allowInternet: boolean;
  /** Files staged only into the grading sandbox, at /tests. */
  testsDir: string;
  /** The oracle's files; never staged into an agent's sandbox except by the oracle itself. */
  solutionDir: string | undefined;
}
