"""The asyncio client (sandgym.aio) against a real node (see test_client.py for the environment)."""

import asyncio
import os
import threading
import unittest

from sandgym import STEP_INFO_KEYS, SandgymError
from sandgym.aio import Platform, SandgymEnv, VectorEnv

URL = os.environ["SANDGYM_URL"]
TOKEN = os.environ["SANDGYM_TOKEN"]
BUSYBOX = {"kind": "sandbox", "sandbox": {"environment": "busybox:latest", "resources": {"memoryMib": 64}}}
ENVS = 48


class AsyncClientTest(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self):
        self.platform = await Platform.connect(URL, TOKEN)

    async def asyncTearDown(self):
        await self.platform.close()

    async def test_many_envs_step_at_once_on_one_channel_without_a_thread_each(self):
        threads_before = threading.active_count()
        async with VectorEnv.make(self.platform, BUSYBOX, ENVS) as envs:
            observations, infos = await envs.reset(seed=3)
            self.assertEqual(len({info["sandboxId"] for info in infos}), ENVS)
            self.assertEqual([info["seed"] for info in infos[:3]], [3, 4, 5])
            # each env writes its own index and reads it back: the replies are not mixed up
            actions = [{"type": "exec", "command": f"echo {i} > /root/i; cat /root/i"} for i in range(ENVS)]
            observations, rewards, terminated, truncated, infos = await envs.step(actions)
            self.assertEqual([o["stdout"] for o in observations], [f"{i}\n" for i in range(ENVS)])
            self.assertTrue(all(type(r) is float for r in rewards))
            self.assertTrue(all(set(STEP_INFO_KEYS) <= set(info) for info in infos))
            # grpc.aio's own few threads at most, not one per env as a thread pool would take
            self.assertLess(threading.active_count() - threads_before, 8)
            ended = [{"type": "submit"} if i % 2 else {"type": "exec", "command": "true"} for i in range(ENVS)]
            await envs.step(ended)
            observations, rewards, terminated, truncated, infos = await envs.step(ended)
            self.assertEqual([info["autoreset"] for info in infos[:2]], [False, True])
            self.assertEqual(infos[1]["outcome"], {"kind": "ok"})
            self.assertEqual(observations[1]["type"], "reset")

    async def test_one_env_checkpoints_restores_and_retries_exactly_once(self):
        async with SandgymEnv(self.platform, BUSYBOX) as env:
            await env.reset(options={"episode_id": "aio-1"})
            await env.step({"type": "exec", "command": "echo kept > /root/state"})
            checkpoint = await env.checkpoint()
            action = {"type": "exec", "command": "echo once >> /root/count; wc -l < /root/count"}
            first = await env.step(action)
            env._next -= 1  # as after a lost answer: the same index again
            again = await env.step(action)
            self.assertEqual((again[0]["stdout"], again[4]["replayed"]), (first[0]["stdout"], True))
            await env.restore(checkpoint)
            observation, *_ = await env.step({"type": "read_file", "path": "/root/state"})
            self.assertEqual(observation["content"], "kept\n")

    async def test_steps_of_one_env_given_at_once_run_in_order(self):
        async with SandgymEnv(self.platform, BUSYBOX) as env:
            await env.reset()
            steps = [{"type": "exec", "command": f"echo {i} >> /root/log"} for i in range(4)]
            results = await asyncio.gather(*(env.step(step) for step in steps))
            self.assertEqual([r[4]["stepIndex"] for r in results], [0, 1, 2, 3])
            self.assertFalse(any(r[4]["replayed"] for r in results))
            observation, *_ = await env.step({"type": "read_file", "path": "/root/log"})
            self.assertEqual(observation["content"], "0\n1\n2\n3\n")

    async def test_sandboxes_attach_and_fork(self):
        async with await self.platform.create_sandbox({"environment": "busybox:latest"}) as sandbox:
            await sandbox.write_file("/root/f", "shared\n")
            attached = await self.platform.attach_sandbox(sandbox.id)
            self.assertEqual((await attached.exec(["cat", "/root/f"])).stdout, "shared\n")
            copies = await sandbox.fork(2)
            try:
                read = await asyncio.gather(*(copy.read_file("/root/f") for copy in copies))
                self.assertEqual(read, [b"shared\n", b"shared\n"])
            finally:
                await asyncio.gather(*(copy.close() for copy in copies))
        other = await Platform.connect(URL, TOKEN, project="other")
        try:
            with self.assertRaises(SandgymError) as raised:
                await other.attach_sandbox(sandbox.id)
            self.assertEqual(raised.exception.code, "not_found")
        finally:
            await other.close()


if __name__ == "__main__":
    unittest.main()
