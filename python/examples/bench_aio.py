"""Steps per second of many envs stepping at once from one asyncio process (for `sandgym bench
remote-step`): each round steps every env once (`true`), all in flight together on one channel.
Prints {"envs": N, "steps": S, "seconds": T, "stepsPerSecond": S/T}.

    SANDGYM_TOKEN=... PYTHONPATH=python /usr/bin/python3 python/examples/bench_aio.py URL ENVS ROUNDS
"""

import asyncio
import json
import os
import sys
import time

from sandgym.aio import Platform, SandgymEnv

# small sandboxes, so a thousand fit on one node
SPEC = {"kind": "sandbox", "sandbox": {"environment": "busybox:latest", "resources": {"memoryMib": 16}}}
ACTION = {"type": "exec", "command": ["true"]}
# envs made and reset at once: each reset creates a sandbox, which the node admits a few at a time
RESET_BATCH = 50


async def main() -> None:
    url, count, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    platform = await Platform.connect(url, os.environ["SANDGYM_TOKEN"])
    envs = [SandgymEnv(platform, SPEC) for _ in range(count)]
    try:
        for start in range(0, count, RESET_BATCH):
            await asyncio.gather(*(env.reset() for env in envs[start : start + RESET_BATCH]))
        await asyncio.gather(*(env.step(ACTION) for env in envs))  # warm-up round
        started = time.perf_counter()
        for _ in range(rounds):
            results = await asyncio.gather(*(env.step(ACTION) for env in envs))
            failed = [r[4]["outcome"] for r in results if r[4]["outcome"]["kind"] != "ok"]
            if failed:
                raise SystemExit(f"{len(failed)} steps failed, first: {failed[0]}")
        seconds = time.perf_counter() - started
    finally:
        for start in range(0, count, RESET_BATCH):
            await asyncio.gather(*(env.close() for env in envs[start : start + RESET_BATCH]), return_exceptions=True)
        await platform.close()
    steps = count * rounds
    print(json.dumps({"envs": count, "steps": steps, "seconds": seconds, "stepsPerSecond": steps / seconds}))


if __name__ == "__main__":
    asyncio.run(main())
