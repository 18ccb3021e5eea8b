"""Times env steps of `true` from Python (for `sandgym bench remote-step`): prints {"times": [ms...]}.

    SANDGYM_TOKEN=... PYTHONPATH=python /usr/bin/python3 python/examples/bench_steps.py URL STEPS WARMUP
"""

import json
import os
import sys
import time

from sandgym import Platform, SandgymEnv


def main():
    url, steps, warmup = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    with Platform.connect(url, os.environ["SANDGYM_TOKEN"]) as platform:
        spec = {"kind": "sandbox", "sandbox": {"environment": "busybox:latest"}}
        with SandgymEnv(platform, spec) as env:
            env.reset()
            times = []
            for i in range(steps + warmup):
                started = time.perf_counter()
                env.step({"type": "exec", "command": ["true"]})
                if i >= warmup:
                    times.append((time.perf_counter() - started) * 1000)
    print(json.dumps({"times": times}))


if __name__ == "__main__":
    main()
