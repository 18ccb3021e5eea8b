"""sandgym.gym against the real gymnasium and a real node (see test_client.py for the
environment). Where gymnasium is missing (Debian's interpreter), only the import without it is
tested; test/system/python-client.test.ts runs this file with the project's .venv too, where it is
installed, and checks that the gymnasium tests ran there."""

import json
import os
import unittest
import warnings

import sandgym.gym as sandgym_gym
from sandgym import STEP_INFO_KEYS, Platform, SandgymError

URL = os.environ["SANDGYM_URL"]
TOKEN = os.environ["SANDGYM_TOKEN"]
TASK = os.environ.get("SANDGYM_TASK", "hello-file")
BUSYBOX = {"kind": "sandbox", "sandbox": {"environment": "busybox:latest", "resources": {"memoryMib": 64}}}
HAS_GYMNASIUM = sandgym_gym.gymnasium is not None


@unittest.skipIf(HAS_GYMNASIUM, "gymnasium is installed here")
class WithoutGymnasiumTest(unittest.TestCase):
    def test_the_module_imports_and_making_an_env_says_what_to_install(self):
        with self.assertRaises(SandgymError) as raised:
            sandgym_gym.Env(BUSYBOX, url=URL, token=TOKEN)
        self.assertEqual(raised.exception.code, "unsupported")
        self.assertIn("pip install", str(raised.exception))


@unittest.skipUnless(HAS_GYMNASIUM, "gymnasium is not installed")
class GymnasiumTest(unittest.TestCase):
    def setUp(self):
        self.platform = Platform.connect(URL, TOKEN)

    def tearDown(self):
        self.platform.close()

    def test_check_env_passes(self):
        import gymnasium
        from gymnasium.utils.env_checker import check_env

        # through gymnasium.make, so check_env also makes and closes a second env from its spec
        env = gymnasium.make(sandgym_gym.ENV_ID, spec=BUSYBOX, url=URL)
        try:
            self.assertNotIn(TOKEN, repr(env.spec))
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                check_env(env.unwrapped)
            # check_env says what it finds doubtful as warnings: there must be none
            self.assertEqual([str(w.message) for w in caught], [])
        finally:
            env.close()

    def test_steps_are_points_of_the_spaces_and_actions_map_to_sandgym_actions(self):
        with sandgym_gym.Env(BUSYBOX, platform=self.platform) as env:
            observation, info = env.reset(seed=5)
            self.assertIn(observation, env.observation_space)
            self.assertEqual(json.loads(observation["json"])["sandboxId"], info["sandboxId"])
            action = {"type": "exec", "command": "printf 'caf\\xc3\\xa9\\n'", "path": "", "content": ""}
            self.assertIn(action, env.action_space)
            observation, reward, terminated, truncated, info = env.step(action)
            self.assertIn(observation, env.observation_space)
            self.assertEqual(json.loads(observation["json"])["stdout"], "café\n")
            self.assertEqual((reward, terminated), (0.0, False))
            self.assertLessEqual(set(STEP_INFO_KEYS), set(info))
            write = {"type": "write_file", "command": "rm -rf /", "path": "/root/a", "content": "x\n"}
            observation, *_ = env.step(write)
            # only the fields of the action's type are sent: the stray command never runs
            self.assertEqual(json.loads(observation["json"])["type"], "written")
            observation, *_ = env.step({"type": "exec", "command": "cat /root/a; ls /bin | wc -l"})
            self.assertEqual(json.loads(observation["json"])["stdout"].split("\n")[0], "x")

    def test_vector_env_batches_and_autoresets_next_step(self):
        import gymnasium
        import numpy as np

        envs = gymnasium.make_vec(sandgym_gym.ENV_ID, num_envs=2, spec={"kind": "task", "path": TASK}, url=URL)
        self.assertIsInstance(envs, sandgym_gym.VectorEnv)
        try:
            observations, infos = envs.reset(seed=1)
            self.assertIn(observations, envs.observation_space)
            self.assertEqual(list(observations["type"]), ["task", "task"])
            write = {"type": "exec", "command": "printf 'hello sandgym\\n' > /app/hello.txt", "path": "", "content": ""}
            submit = {"type": "submit", "command": "", "path": "", "content": ""}
            actions = {key: (write[key], submit[key]) for key in write}
            self.assertIn(actions, envs.action_space)
            observations, rewards, terminated, truncated, infos = envs.step(actions)
            self.assertEqual(rewards.dtype, np.float64)
            self.assertEqual(list(terminated), [False, True])
            self.assertEqual(list(infos["outcome"]["kind"]), ["ok", "ok"])
            actions = {key: (submit[key], write[key]) for key in write}
            observations, rewards, terminated, truncated, infos = envs.step(actions)
            self.assertEqual(list(rewards), [1.0, 0.0])
            self.assertEqual(list(infos["autoreset"]), [False, True])
            self.assertEqual(list(observations["type"]), ["submitted", "task"])
        finally:
            envs.close()


if __name__ == "__main__":
    unittest.main()
