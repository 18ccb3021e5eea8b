"""One served env episode that goes on across a restart of the env's node.

Run by test/system/served-env-restart.test.ts with SANDGYM_URL (a controller or a node) and
SANDGYM_TOKEN. It steps once, prints "stepped", then waits for a line on stdin (the test kills
the node meanwhile) and steps again: the client's retry waits for the node to come back, and the
rebuilt env goes on in the same sandbox. Prints the second step's observation as JSON.
"""

import json
import os
import sys

from sandgym import Platform, SandgymEnv

SPEC = {"kind": "sandbox", "sandbox": {"environment": "busybox:latest", "resources": {"memoryMib": 128}}}

with Platform.connect(os.environ["SANDGYM_URL"], os.environ["SANDGYM_TOKEN"]) as platform:
    with SandgymEnv(platform, SPEC) as env:
        env.reset()
        env.step({"type": "exec", "command": "echo before > /root/mark"})
        print("stepped", flush=True)
        sys.stdin.readline()
        observation, reward, terminated, truncated, info = env.step({"type": "exec", "command": "cat /root/mark"})
        print(json.dumps({"observation": observation, "reward": reward, "info": info}), flush=True)
