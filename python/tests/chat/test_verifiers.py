"""sandgym.adapters.verifiers: verifiers' own rollout machinery (verifiers 0.4, from the project's
.venv) plays sandgym episodes against a real node, with a scripted model served on loopback.
Run by test/system/python-chat.test.ts (environment: see test_chat.py)."""

import asyncio
import json
import os
import subprocess
import threading
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from sandgym import Platform

URL = os.environ["SANDGYM_URL"]
TOKEN = os.environ["SANDGYM_TOKEN"]


def hermes(name, **arguments):
    return {"content": f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"}


def writes(content):
    call = hermes("write_file", path="/app/hello.txt", content=content)["content"]
    return {"content": call + hermes("submit")["content"]}


class ScriptedModel:
    """An OpenAI-compatible chat completions server on loopback that answers with `replies`, in
    order, and keeps the requests it was sent."""

    def __init__(self, replies):
        self.replies = list(replies)
        self.requests = []
        model = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                model.requests.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                message = {"role": "assistant", "content": None, **(model.replies.pop(0) if model.replies else {"content": "out of script"})}
                body = json.dumps(
                    {
                        "id": f"chatcmpl-{len(model.requests)}",
                        "object": "chat.completion",
                        "created": 0,
                        "model": "scripted",
                        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def rollout(replies, agent=None, **chat):
    """One verifiers episode of hello-file, played by a scripted model: (the episode, the model).
    `agent` overrides the agent's config; `chat`, the chat env's."""
    import verifiers.v1 as vf

    taskset = {"id": "sandgym-verifiers", "tasks": ["hello-file"], "task": {"url": URL, "chat": {"max_turns": 5, **chat}}}
    config = vf.resolve_env_config({"taskset": taskset, **({"agent": agent} if agent else {})})
    env = vf.load_environment(config)
    model = ScriptedModel(replies)
    # any variable but PRIME_API_KEY, whose client config looks for a Prime login
    ctx = vf.ModelContext(model="scripted", client=vf.EvalClientConfig(base_url=model.url, api_key_var="SCRIPTED_MODEL_KEY"))

    async def play():
        async with env.serving():
            [task] = list(env.taskset)
            return await env.run_slot(env.slots(task)[0], ctx)

    try:
        return asyncio.run(play()), model
    finally:
        model.close()


class VerifiersAdapterTest(unittest.TestCase):
    def setUp(self):
        self.platform = Platform.connect(URL, TOKEN)

    def tearDown(self):
        self.platform.close()

    def assert_no_sandbox_left(self, trace):
        # the rollout made an env on the node, and closed it with its sandbox when it ended
        self.assertIsNotNone(trace.state.env_id)
        self.assertEqual(self.platform.list_sandboxes(), [])

    def test_an_honest_run_scores_1(self):
        episode, model = rollout([writes("hello sandgym\n")])
        self.assertTrue(episode.ok, episode.errors)
        [trace] = episode.traces
        self.assertTrue(trace.ok, trace.errors)
        self.assertEqual(trace.reward, 1.0)
        self.assertEqual((trace.state.turns, trace.state.terminated), (1, True))
        # the model saw the node's opening messages and its tools
        [request] = model.requests
        self.assertIn("/app/hello.txt", request["messages"][-1]["content"])
        self.assertEqual([t["function"]["name"] for t in request["tools"]], ["exec", "write_file", "read_file", "list_dir", "submit"])
        self.assert_no_sandbox_left(trace)

    def test_a_wrong_run_scores_0(self):
        episode, _ = rollout([writes("goodbye\n")])
        [trace] = episode.traces
        self.assertTrue(trace.ok, trace.errors)
        self.assertEqual(trace.reward, 0.0)
        self.assertEqual((trace.state.turns, trace.state.terminated), (1, True))
        self.assert_no_sandbox_left(trace)

    def test_malformed_turns_are_observations(self):
        unknown_tool = {"id": "c1", "type": "function", "function": {"name": "format_disk", "arguments": '{"device": "/dev/sda"}'}}
        bad_arguments = {"id": "c2", "type": "function", "function": {"name": "write_file", "arguments": "{not json"}}
        episode, model = rollout(
            [
                {"content": '<tool_call>{"name": "write_file", "arguments": {'},
                {"tool_calls": [unknown_tool, bad_arguments]},
                writes("hello sandgym\n"),
            ],
            format="hermes",
        )
        [trace] = episode.traces
        self.assertTrue(trace.ok, trace.errors)
        self.assertEqual((trace.reward, trace.state.turns), (1.0, 3))
        # each malformed turn came back to the model as the node's tool messages
        told = [[m for m in request["messages"] if m["role"] == "tool"] for request in model.requests]
        self.assertEqual(len(told[1]), 1)
        self.assertRegex(told[1][0]["content"], "^Invalid call: the tool call is not JSON")
        self.assertEqual([m["tool_call_id"] for m in told[2][1:]], ["c1", "c2"])
        self.assertRegex(told[2][1]["content"], 'no tool "format_disk"')
        self.assertRegex(told[2][2]["content"], "JSON")
        self.assert_no_sandbox_left(trace)

    def test_a_limit_of_verifiers_ends_the_episode(self):
        # verifiers refuses the third model call: the rollout stops there, scored, its env closed
        episode, model = rollout([{"content": "Let me think."}] * 3, agent={"max_turns": 2})
        [trace] = episode.traces
        self.assertTrue(trace.ok, trace.errors)
        self.assertEqual(trace.stop_condition, "max_turns")
        self.assertEqual((trace.reward, trace.state.turns, trace.state.terminated), (0.0, 2, False))
        self.assertEqual(len(model.requests), 2)
        self.assert_no_sandbox_left(trace)

    def test_importable_without_verifiers(self):
        # Debian's interpreter, which has grpcio and msgpack but no verifiers
        script = (
            "import sandgym.adapters.verifiers as adapter\n"
            "try:\n    adapter.SandgymTaskset\nexcept ImportError as error:\n    print(error)\n"
        )
        run = subprocess.run(["/usr/bin/python3", "-c", script], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))})
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertIn("pip install 'verifiers", run.stdout)


if __name__ == "__main__":
    unittest.main()
