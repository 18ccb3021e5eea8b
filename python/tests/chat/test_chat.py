"""The chat env and its trainer adapters against a real node agent, which the test that runs
this file started (test/system/python-chat.test.ts).

Environment: SANDGYM_URL (grpc://HOST:PORT), SANDGYM_TOKEN (the node token); the node's task
root holds hello-file. Needs skyrl-gym (python/requirements-test.txt) for the adapter's test.
"""

import json
import os
import unittest

from sandgym import Platform, SandgymEnv, SandgymError
from sandgym.chat import ChatEnv

URL = os.environ["SANDGYM_URL"]
TOKEN = os.environ["SANDGYM_TOKEN"]
TASK = {"kind": "task", "path": "hello-file"}
BUSYBOX = {"kind": "sandbox", "sandbox": {"environment": "busybox:latest", "resources": {"memoryMib": 128}}}


def hermes(name, **arguments):
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


WRITE = hermes("write_file", path="/app/hello.txt", content="hello sandgym\n")


class ChatEnvTest(unittest.TestCase):
    def setUp(self):
        self.platform = Platform.connect(URL, TOKEN)

    def tearDown(self):
        self.platform.close()

    def test_a_task_episode_from_text_answers(self):
        with ChatEnv(self.platform, TASK, system_prompt="Be brief.", max_turns=5) as env:
            messages, info = env.reset(options={"episode_id": "py-chat-1"})
            self.assertEqual(messages[0], {"role": "system", "content": "Be brief."})
            self.assertIn("/app/hello.txt", messages[1]["content"])
            self.assertEqual(info["episodeId"], "py-chat-1")
            self.assertEqual([t["function"]["name"] for t in env.tools], ["exec", "write_file", "read_file", "list_dir", "submit"])
            messages, reward, terminated, truncated, info = env.step(f"Writing it.\n{WRITE}\n{hermes('submit')}")
            self.assertEqual([m["content"] for m in messages], ["wrote /app/hello.txt", "submitted"])
            self.assertEqual((reward, terminated, truncated), (1.0, True, False))
            self.assertIsInstance(reward, float)
            self.assertEqual(info["outcome"], {"kind": "ok"})
            self.assertEqual([c["stepIndex"] for c in info["calls"]], [0, 1])
            self.assertEqual(info["grade"]["reward"], 1)
            with self.assertRaises(SandgymError) as ended:
                env.step(hermes("submit"))
            self.assertEqual(ended.exception.code, "failed_precondition")

    def test_chat_completions_messages_and_the_turn_budget(self):
        with ChatEnv(self.platform, TASK, max_turns=2) as env:
            env.reset()
            answer = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "w1", "type": "function", "function": {"name": "write_file", "arguments": json.dumps({"path": "/app/hello.txt", "content": "hello sandgym\n"})}},
                ],
            }
            messages, *_ = env.step(answer)
            self.assertEqual(messages, [{"role": "tool", "tool_call_id": "w1", "name": "write_file", "content": "wrote /app/hello.txt"}])
            messages, reward, terminated, truncated, info = env.step("I am done.")
            self.assertRegex(messages[0]["content"], "^No tool call found")
            self.assertEqual((reward, terminated, truncated, info["truncatedBy"]), (1.0, False, True, "turn_limit"))

    def test_a_parser_of_the_callers_and_a_tokenizer(self):
        def pythonic(text):
            # `exec("...")` lines
            return [{"name": "exec", "arguments": {"command": line[6:-2]}} for line in text.splitlines() if line.startswith('exec("')]

        words = lambda text: len(text.split())
        with ChatEnv(self.platform, BUSYBOX, instruction="Count.", parser=pythonic, count_tokens=words, max_tokens=12) as env:
            messages, _ = env.reset()
            self.assertEqual(messages[1], {"role": "user", "content": "Count."})
            messages, _, _, truncated, info = env.step('exec("echo one two")')
            self.assertEqual(messages[0]["content"], "one two\n[exit code 0]")
            # the answer's 3 words and the instruction's 1
            self.assertEqual((info["tokens"], truncated), (4, False))
            messages, _, _, truncated, info = env.step('exec("echo three four five six")')
            # 5 more, and the 5 of what the last turn showed
            self.assertEqual((info["tokens"], truncated, info["truncatedBy"]), (14, True, "token_limit"))

    def test_answers_that_cannot_be_read_are_observations(self):
        def broken(text):
            raise ValueError("unbalanced parenthesis")

        with ChatEnv(self.platform, BUSYBOX, parser=broken) as env:
            env.reset()
            messages, reward, terminated, truncated, info = env.step("exec((")
            self.assertRegex(messages[0]["content"], "^No tool call found")
            self.assertEqual(info["parse_error"], "ValueError: unbalanced parenthesis")
            self.assertEqual((reward, terminated, truncated, info["outcome"]), (0.0, False, False, {"kind": "ok"}))
        with ChatEnv(self.platform, BUSYBOX) as env:
            env.reset()
            messages, *_ = env.step("<tool_call>" + "[" * 100_000)
            self.assertRegex(messages[0]["content"], "deeper than 64 levels")
            messages, *_ = env.step(hermes("format_disk", device="/dev/sda"))
            self.assertRegex(messages[0]["content"], 'no tool "format_disk"')
            # the honest twin: the episode goes on
            messages, *_ = env.step(hermes("exec", command="echo fine"))
            self.assertEqual(messages[0]["content"], "fine\n[exit code 0]")

    def test_forks_go_on_from_where_the_episode_was(self):
        lead = ChatEnv(self.platform, TASK, max_turns=3)
        forks = []
        try:
            lead.reset(options={"episode_id": "py-fork-lead"})
            lead.step(hermes("write_file", path="/app/hello.txt", content="draft\n"))
            forks = lead.fork(3, episode_ids=["py-fork-0", "py-fork-1", "py-fork-2"])
            self.assertEqual(len({f.env_id for f in forks} | {lead.env_id}), 4)
            # each fork is its own sandbox with the lead's files, and the turn budget spent so far
            right, wrong, reader = forks
            messages, reward, terminated, _, info = right.step(WRITE + hermes("submit"))
            self.assertEqual((reward, terminated, info["episodeId"], info["turns"]), (1.0, True, "py-fork-0", 2))
            _, reward, terminated, _, info = wrong.step(hermes("submit"))
            self.assertEqual((reward, terminated, info["grade"]["reward"]), (0.0, True, 0))
            messages, *_ = reader.step(hermes("read_file", path="/app/hello.txt"))
            self.assertEqual(messages[0]["content"], "draft\n")
            _, reward, _, truncated, info = reader.step("thinking")
            self.assertEqual((truncated, info["truncatedBy"], info["turns"]), (True, "turn_limit", 3))
            # the lead goes on untouched by its forks
            messages, *_ = lead.step(hermes("read_file", path="/app/hello.txt"))
            self.assertEqual(messages[0]["content"], "draft\n")
        finally:
            for env in [lead, *forks]:
                env.close()

    def test_what_a_fork_cannot_take(self):
        with SandgymEnv(self.platform, BUSYBOX) as gym, ChatEnv(self.platform, BUSYBOX) as plain, ChatEnv(self.platform, BUSYBOX) as other:
            gym.reset()
            plain.reset()
            other.reset()
            # a checkpoint made outside a chat episode is no chat episode to go on with
            outside = self.platform._wire.call("Envs", "Checkpoint", {"envId": gym.env_id, "depth": "disk"})
            with self.assertRaises(SandgymError) as refused:
                other.restore(outside)
            self.assertEqual(refused.exception.code, "failed_precondition")
            # the honest twin: one made in a chat episode restores into another env
            other.step(hermes("exec", command="echo kept > /tmp/mark"))
            saved = other.checkpoint(depth="disk")
            _, info = plain.restore(saved, "py-fork-twin")
            self.assertEqual((info["turns"], info["episodeId"]), (1, "py-fork-twin"))
            messages, *_ = plain.step(hermes("exec", command="cat /tmp/mark"))
            self.assertEqual(messages[0]["content"], "kept\n[exit code 0]")
            with self.assertRaises(SandgymError) as bad:
                plain.checkpoint(depth="swap")
            self.assertEqual(bad.exception.code, "invalid_argument")
            # an env to be made beside is the caller's own, as any id it names
            with self.assertRaises(SandgymError) as elsewhere:
                self.platform._wire.call("Envs", "Make", {"spec": BUSYBOX, "beside": "env-elsewhere-0a1b2c3d4e5f"})
            self.assertEqual(elsewhere.exception.code, "not_found")

    def test_the_asyncio_chat_env_and_its_forks(self):
        import asyncio

        from sandgym import aio

        async def group():
            platform = await aio.Platform.connect(URL, TOKEN)
            try:
                async with aio.ChatEnv(platform, TASK, max_turns=4) as lead:
                    messages, info = await lead.reset()
                    self.assertEqual((info["turns"], len(lead.tools)), (0, 5))
                    forks = await lead.fork(2)
                    try:
                        answers = [WRITE + hermes("submit"), hermes("submit")]
                        results = await asyncio.gather(*(f.step(a) for f, a in zip(forks, answers)))
                        self.assertEqual([r[1] for r in results], [1.0, 0.0])
                    finally:
                        await asyncio.gather(*(f.close() for f in forks))
            finally:
                await platform.close()

        asyncio.run(group())


class SkyRLAdapterTest(unittest.TestCase):
    def test_a_skyrl_text_env_made_by_skyrl_gym(self):
        import skyrl_gym
        from skyrl_gym.envs.base_text_env import BaseTextEnv

        from sandgym.adapters.skyrl import register

        register("sandgym-test")
        env = skyrl_gym.make(
            "sandgym-test",
            env_config={"url": URL, "token": TOKEN, "max_turns": 3, "format": "hermes"},
            extras={"task": "hello-file"},
        )
        try:
            self.assertIsInstance(env, BaseTextEnv)
            prompt, metadata = env.init([{"role": "user", "content": "the dataset's prompt"}])
            self.assertIn("/app/hello.txt", prompt[-1]["content"])
            self.assertEqual(len(metadata["tools"]), 5)
            out = env.step("no calls here")
            self.assertEqual((out["reward"], out["done"]), (0.0, False))
            out = env.step(WRITE + hermes("submit"))
            self.assertEqual((out["reward"], out["done"]), (1.0, True))
            self.assertEqual([m["role"] for m in out["observations"]], ["tool", "tool"])
            self.assertEqual(env.turns, 2)
        finally:
            env.close()
        with self.assertRaises(SandgymError):
            skyrl_gym.make("sandgym-test", env_config={"url": URL, "token": TOKEN}, extras={})


if __name__ == "__main__":
    unittest.main()
