"""The Python client against a real node agent, which the test that runs this file started.

Environment: SANDGYM_URL (grpc://HOST:PORT), SANDGYM_TOKEN (the node token), SANDGYM_TASK (a
task path under the node's task root). Run: PYTHONPATH=python python3 -m unittest discover -s python/tests
"""

import os
import unittest

from sandgym import Platform, SandgymEnv, SandgymError, VectorEnv

URL = os.environ["SANDGYM_URL"]
TOKEN = os.environ["SANDGYM_TOKEN"]
TASK = os.environ.get("SANDGYM_TASK", "hello-file")
BUSYBOX = {"kind": "sandbox", "sandbox": {"environment": "busybox:latest", "resources": {"memoryMib": 128}}}


class ClientTest(unittest.TestCase):
    def setUp(self):
        self.platform = Platform.connect(URL, TOKEN)

    def tearDown(self):
        self.platform.close()

    def test_sandbox_exec_files_and_close(self):
        with self.platform.create_sandbox({"environment": "busybox:latest"}) as sandbox:
            result = sandbox.exec("echo hello; echo oops >&2; exit 3")
            self.assertEqual((result.exit_code, result.stdout, result.stderr), (3, "hello\n", "oops\n"))
            self.assertEqual(sandbox.exec(["pwd"], cwd="/tmp").stdout, "/tmp\n")
            sandbox.write_file("/root/data.bin", b"\x00\x01binary")
            self.assertEqual(sandbox.read_file("/root/data.bin"), b"\x00\x01binary")
            self.assertIn("data.bin", [entry.name for entry in sandbox.list_dir("/root")])
            sandbox_id = sandbox.id
        self.assertNotIn(sandbox_id, [s["id"] for s in self.platform.list_sandboxes()])

    def test_file_calls_as_a_user_have_its_rights_only(self):
        with self.platform.create_sandbox({"environment": "busybox:latest"}) as sandbox:
            sandbox.exec("echo 'app:x:1000:1000::/tmp:/bin/sh' >> /etc/passwd; echo hidden > /root/secret; chmod 600 /root/secret; chmod 700 /root")
            for call in (
                lambda: sandbox.read_file("/root/secret", user="app"),
                lambda: sandbox.write_file("/etc/passwd", "app::0:0::/:/bin/sh\n", user="app"),
                lambda: sandbox.list_dir("/root", user="app"),
            ):
                with self.assertRaises(SandgymError) as denied:
                    call()
                self.assertEqual(denied.exception.code, "permission_denied")
            sandbox.write_file("/tmp/mine", "x", mode=0o4755, user="app")
            self.assertEqual(sandbox.exec("stat -c %u:%a /tmp/mine").stdout, "1000:4755\n")
            self.assertIn("mine", [entry.name for entry in sandbox.list_dir("/tmp", user="app")])

    def test_errors_carry_the_platform_code(self):
        with self.assertRaises(SandgymError) as raised:
            self.platform.create_sandbox({"environment": "busybox:latest", "resources": {"memoryMib": "lots"}})
        self.assertEqual(raised.exception.code, "invalid_argument")
        self.assertIn("memoryMib", str(raised.exception))
        with self.assertRaises(SandgymError) as missing:
            self.platform.create_sandbox({"environment": "no-such-env:1"})
        self.assertEqual(missing.exception.code, "not_found")

    def test_env_steps_checkpoints_and_restores(self):
        with SandgymEnv(self.platform, BUSYBOX) as env:
            observation, info = env.reset(options={"episodeId": "py-1"})
            self.assertEqual(observation["type"], "reset")
            self.assertEqual(info["episodeId"], "py-1")
            observation, reward, terminated, truncated, info = env.step(
                {"type": "exec", "command": "echo kept > /root/state; cat /root/state"}
            )
            self.assertEqual(observation["stdout"], "kept\n")
            self.assertEqual((reward, terminated, truncated), (0, False, False))
            self.assertEqual(info["outcome"], {"kind": "ok"})
            self.assertEqual(info["signals"]["limitsHit"], [])
            self.assertFalse(info["replayed"])
            checkpoint = env.checkpoint()
            self.assertEqual(checkpoint["stepIndex"], 1)
            env.step({"type": "exec", "command": "rm /root/state"})
            observation, info = env.restore(checkpoint)
            observation, *_ = env.step({"type": "read_file", "path": "/root/state"})
            self.assertEqual(observation, {"type": "file", "path": "/root/state", "content": "kept\n"})
            observation, reward, terminated, *_ = env.step({"type": "submit"})
            self.assertTrue(terminated)

    def test_a_retried_step_answers_with_what_it_did(self):
        with SandgymEnv(self.platform, BUSYBOX) as env:
            env.reset()
            action = {"type": "exec", "command": "echo once >> /root/count; wc -l < /root/count"}
            first = env.step(action)
            # the same index again, as after a lost answer: the record, not a second run
            env._next -= 1
            again = env.step(action)
            self.assertEqual(again[0]["stdout"], first[0]["stdout"])
            self.assertTrue(again[4]["replayed"])
            observation, *_ = env.step({"type": "exec", "command": "wc -l < /root/count"})
            self.assertEqual(observation["stdout"], "1\n")
            # a malformed action is the policy's to answer for: an observation, never an error
            observation, *_ = env.step({"type": "exec", "command": 42})
            self.assertEqual((observation["type"], observation["code"]), ("error", "invalid_action"))

    def test_a_task_env_grades_on_the_node(self):
        with SandgymEnv(self.platform, {"kind": "task", "path": TASK}) as env:
            observation, info = env.reset()
            self.assertEqual(observation["type"], "task")
            self.assertIn("hello.txt", observation["instruction"])
            env.step({"type": "exec", "command": "printf 'hello sandgym\\n' > /app/hello.txt"})
            observation, reward, terminated, truncated, info = env.step({"type": "submit"})
            self.assertEqual((reward, terminated), (1, True))
            self.assertEqual(info["grade"]["reward"], 1)

    def test_a_task_outside_the_root_is_refused(self):
        with self.assertRaises(SandgymError) as raised:
            SandgymEnv(self.platform, {"kind": "task", "path": "../../etc"}).reset()
        self.assertIn(raised.exception.code, ("invalid_argument", "not_found"))

    def test_another_projects_env_is_not_found(self):
        with SandgymEnv(self.platform, BUSYBOX) as env:
            env.reset()
            checkpoint = env.checkpoint()
            with Platform.connect(URL, TOKEN, project="other") as other:
                stranger = SandgymEnv(other, BUSYBOX)
                stranger.env_id = env.env_id
                with self.assertRaises(SandgymError) as raised:
                    stranger.step({"type": "exec", "command": "echo hijack"})
                self.assertEqual(raised.exception.code, "not_found")
                with self.assertRaises(SandgymError):
                    stranger.close()
                with SandgymEnv(other, BUSYBOX) as own:
                    own.reset()
                    with self.assertRaises(SandgymError) as restored:
                        own.restore(checkpoint)
                    self.assertEqual(restored.exception.code, "not_found")
            # the owner's env goes on untouched
            observation, *_ = env.step({"type": "exec", "command": "echo mine"})
            self.assertEqual(observation["stdout"], "mine\n")

    def test_vector_env_steps_together_and_autoresets(self):
        with VectorEnv.make(self.platform, BUSYBOX, 2) as envs:
            observations, infos = envs.reset(seed=7)
            self.assertEqual([o["type"] for o in observations], ["reset", "reset"])
            self.assertNotEqual(infos[0]["sandboxId"], infos[1]["sandboxId"])
            observations, rewards, terminated, truncated, infos = envs.step(
                [{"type": "exec", "command": "echo a"}, {"type": "submit"}]
            )
            self.assertEqual(observations[0]["stdout"], "a\n")
            self.assertEqual(terminated, [False, True])
            observations, rewards, terminated, truncated, infos = envs.step(
                [{"type": "exec", "command": "echo b"}, {"type": "submit"}]
            )
            self.assertEqual(observations[1]["type"], "reset")
            self.assertTrue(infos[1]["autoreset"])


if __name__ == "__main__":
    unittest.main()
