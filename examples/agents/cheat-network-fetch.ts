// An agent module for `sandgym eval --agent`: see cheats.ts.
import { scriptedAgent, type Agent } from '../../src/rollout/index.ts';
import { CHEATS } from './cheats.ts';

export default (): Agent => scriptedAgent(CHEATS['cheat-network-fetch'] ?? []);
