"""A rollout loop in Python: a few episodes of a task on a sandgym node, with a scripted policy.

    SANDGYM_TOKEN=... PYTHONPATH=python /usr/bin/python3 python/examples/rollout.py grpc://HOST:PORT [TASK]

TASK is a task path under the node's --task-root (default hello-file). Replace `policy` with
your model: it gets the observation (a map) and returns an action (a map).
"""

import os
import sys

from sandgym import Platform, SandgymEnv, VectorEnv


def policy(observation, step):
    """Writes the answer, then submits: what a model would learn to do."""
    if step == 0:
        return {"type": "exec", "command": "printf 'hello sandgym\\n' > /app/hello.txt"}
    return {"type": "submit"}


def main():
    url = sys.argv[1] if len(sys.argv) > 1 else "grpc://127.0.0.1:7100"
    task = sys.argv[2] if len(sys.argv) > 2 else "hello-file"
    with Platform.connect(url, os.environ["SANDGYM_TOKEN"]) as platform:
        spec = {"kind": "task", "path": task}
        with VectorEnv([SandgymEnv(platform, spec) for _ in range(2)]) as envs:
            observations, infos = envs.reset(seed=0)
            done = [False] * len(envs.envs)
            returns = [0.0] * len(envs.envs)
            step = 0
            while not all(done):
                actions = [policy(observation, step) for observation in observations]
                observations, rewards, terminated, truncated, infos = envs.step(actions)
                for i in range(len(done)):
                    if not done[i]:
                        returns[i] += rewards[i]
                        if infos[i]["outcome"]["kind"] != "ok":
                            print(f"episode {i}: {infos[i]['outcome']} (masked, not a reward)")
                        done[i] = done[i] or terminated[i] or truncated[i]
                step += 1
            print(f"returns: {returns} after {step} steps")


if __name__ == "__main__":
    main()
