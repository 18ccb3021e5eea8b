"""What makes the Python client first class, against a real node (see test_client.py for the
environment): the same info keys on every step, float rewards, snake_case actions, and sandbox
attach, checkpoint and fork."""

import os
import unittest

from sandgym import STEP_INFO_KEYS, Platform, Sandbox, SandgymEnv, SandgymError, VectorEnv

URL = os.environ["SANDGYM_URL"]
TOKEN = os.environ["SANDGYM_TOKEN"]
TASK = os.environ.get("SANDGYM_TASK", "hello-file")
BUSYBOX = {"kind": "sandbox", "sandbox": {"environment": "busybox:latest", "resources": {"memoryMib": 128}}}


class StepShapeTest(unittest.TestCase):
    def setUp(self):
        self.platform = Platform.connect(URL, TOKEN)

    def tearDown(self):
        self.platform.close()

    def test_every_step_has_the_same_info_keys_and_a_float_reward(self):
        with VectorEnv.make(self.platform, {"kind": "task", "path": TASK}, 2) as envs:
            envs.reset()
            write = {"type": "exec", "command": "printf 'hello sandgym\\n' > /app/hello.txt"}
            steps = [
                envs.step([write, {"type": "submit"}]),  # a plain step; a graded submit (reward 0)
                envs.step([{"type": "submit"}, write]),  # a graded submit (reward 1); the autoreset step
            ]
            seen = []
            for observations, rewards, terminated, truncated, infos in steps:
                for reward, info in zip(rewards, infos):
                    self.assertIs(type(reward), float)
                    # a newer node may add keys; these are on every step whatever it was
                    self.assertLessEqual(set(STEP_INFO_KEYS), set(info))
                    # the README's pattern, on every kind of step
                    self.assertEqual(info["outcome"]["kind"], "ok")
                    seen.append(info)
            self.assertEqual(steps[1][1][0], 1.0)
            self.assertEqual(steps[1][4][0]["grade"]["reward"], 1)
            autoreset = steps[1][4][1]
            self.assertEqual((autoreset["autoreset"], autoreset["stepIndex"]), (True, -1))
            self.assertEqual(autoreset["episodeId"], autoreset["resetInfo"]["episodeId"])
            self.assertEqual(steps[1][0][1]["type"], "task")
            self.assertIsNone(seen[0]["grade"])

    def test_snake_case_action_fields_reach_the_node(self):
        with SandgymEnv(self.platform, BUSYBOX) as env:
            env.reset(options={"episode_id": "snake-1"})
            observation, *_, info = env.step({"type": "exec", "command": "sleep 30", "timeout_ms": 200})
            # sent as is, the node would drop the field it does not know and sleep the 30 s out
            self.assertTrue(observation["timedOut"])
            self.assertEqual(info["episodeId"], "snake-1")
            # camelCase still works, and wins when both are given (it is what the node reads)
            observation, *_ = env.step({"type": "exec", "command": "sleep 30", "timeoutMs": 200, "timeout_ms": 60_000})
            self.assertTrue(observation["timedOut"])

    def test_a_policy_mistake_is_an_observation_whatever_its_shape(self):
        with SandgymEnv(self.platform, BUSYBOX) as env:
            env.reset()
            for given in ("ls", ["exec"], {"type": "exec", "timeout_ms": "soon", "command": "true"}):
                observation, reward, terminated, truncated, info = env.step(given)
                self.assertEqual((observation["type"], observation["code"]), ("error", "invalid_action"))
                self.assertEqual((reward, terminated), (0.0, False))


class SandboxHandleTest(unittest.TestCase):
    def setUp(self):
        self.platform = Platform.connect(URL, TOKEN)

    def tearDown(self):
        self.platform.close()

    def test_attach_finds_the_projects_sandbox_and_no_other(self):
        with self.platform.create_sandbox({"environment": "busybox:latest"}) as sandbox:
            sandbox.exec("echo mine > /root/f")
            attached = self.platform.attach_sandbox(sandbox.id)
            self.assertEqual(attached.exec("cat /root/f").stdout, "mine\n")
            self.assertEqual(attached.labels.get("environment"), "busybox:latest")
            with Platform.connect(URL, TOKEN, project="other") as other:
                with self.assertRaises(SandgymError) as raised:
                    other.attach_sandbox(sandbox.id)
                self.assertEqual(raised.exception.code, "not_found")

    def test_fork_on_disk_copies_files_and_gives_each_copy_its_own_fork_value(self):
        with self.platform.create_sandbox({"environment": "busybox:latest"}) as sandbox:
            sandbox.write_file("/root/state", "before the fork\n")
            copies = sandbox.fork(3)
            try:
                self.assertEqual(len({copy.id for copy in copies} | {sandbox.id}), 4)
                values = set()
                for copy in copies:
                    self.assertEqual(copy.read_file("/root/state"), b"before the fork\n")
                    values.add(copy.exec("cat /run/sandgym/fork").stdout)
                    copy.exec("echo theirs > /root/state")
                self.assertEqual(len(values), 3)
                self.assertEqual(sandbox.read_file("/root/state"), b"before the fork\n")
            finally:
                for copy in copies:
                    copy.close()

    def test_fork_of_another_projects_sandbox_makes_nothing(self):
        with self.platform.create_sandbox({"environment": "busybox:latest"}) as sandbox:
            with Platform.connect(URL, TOKEN, project="other") as other:
                # a handle forged from what the owner's handle holds: the node still checks the id
                forged = Sandbox(other._wire, sandbox.info)
                for depth in ("disk", "memory"):
                    with self.assertRaises(SandgymError) as raised:
                        forged.fork(2, depth=depth)
                    self.assertEqual(raised.exception.code, "not_found")
                self.assertEqual(other.list_sandboxes(), [])

    def test_checkpoint_restores_in_place_and_forks_in_memory(self):
        with self.platform.create_sandbox({"environment": "busybox:latest"}) as sandbox:
            try:
                sandbox.exec("echo saved > /root/f")
                checkpoint = sandbox.checkpoint()
            except SandgymError as error:
                if error.code == "unsupported":
                    self.skipTest(f"this node cannot checkpoint: {error}")
                raise
            self.assertEqual((checkpoint["sandboxId"], checkpoint["depth"]), (sandbox.id, "memory"))
            sandbox.exec("rm /root/f")
            sandbox.restore(checkpoint)
            self.assertEqual(sandbox.exec("cat /root/f").stdout, "saved\n")
            copies = sandbox.fork(2, depth="memory", checkpoint=checkpoint["id"])
            try:
                self.assertEqual([copy.exec("cat /root/f").stdout for copy in copies], ["saved\n"] * 2)
            finally:
                for copy in copies:
                    copy.close()

    def test_fork_arguments_are_checked_before_any_call(self):
        with self.platform.create_sandbox({"environment": "busybox:latest"}) as sandbox:
            for count, depth in ((0, "disk"), (2, "deep"), (True, "disk")):
                with self.assertRaises(SandgymError) as raised:
                    sandbox.fork(count, depth=depth)
                self.assertEqual(raised.exception.code, "invalid_argument")
            with self.assertRaises(SandgymError) as raised:
                sandbox.fork(1, checkpoint="ckpt-0123")
            self.assertEqual(raised.exception.code, "invalid_argument")


if __name__ == "__main__":
    unittest.main()
