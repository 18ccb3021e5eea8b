"""The classes of `sandgym.adapters.verifiers` (see its docstring); importing this needs verifiers."""

import asyncio
import os
from collections.abc import Iterator
from typing import Any

import httpx
import verifiers.v1 as vf
from pydantic import Field
from verifiers.v1.task import task_key

from ..chat import ChatEnv
from ..platform import Platform


class SandgymChatConfig(vf.BaseConfig):
    """How the chat env talks to the model: `sandgym.chat.ChatEnv`'s options."""

    system_prompt: str | None = None
    """The system message; the task's `system_prompt` (a taskset's override, GEPA's) wins."""
    instruction: str | None = None
    """The user message of a sandbox env (a task env's is its instruction)."""
    max_turns: int | None = None
    max_tokens: int | None = None
    format: str | None = None
    """How text replies hold calls: "auto" (the node's default), "hermes" or "llama3"."""


class SandgymTaskConfig(vf.TaskConfig):
    """Where each task's env runs, under `--env.taskset.task.*`."""

    url: str = ""
    """The node or controller: grpc://HOST:PORT."""
    token_var: str = "SANDGYM_TOKEN"
    """The environment variable that holds its token: verifiers saves configs with results."""
    project: str | None = None
    chat: SandgymChatConfig = SandgymChatConfig()


class SandgymTasksetConfig(vf.TasksetConfig):
    """One task per env named, under `--env.taskset.*`."""

    task: SandgymTaskConfig = SandgymTaskConfig()
    tasks: list[str] = Field(default_factory=list)
    """Task envs: paths under the node's --task-root."""
    specs: list[dict[str, Any]] = Field(default_factory=list)
    """Any Envs specs ({"kind": "sandbox", "sandbox": {...}}, ...)."""


class SandgymData(vf.TaskData):
    spec: dict[str, Any]
    """The Envs spec each rollout of the task makes its env from."""


class SandgymState(vf.State):
    """What a rollout's episode did, for scoring and for the trace."""

    node: SandgymTaskConfig = SandgymTaskConfig()
    env_id: str | None = None
    episode_return: float = 0.0
    """The sum of the steps' rewards (a task env's is its grade, given when the episode ends)."""
    turns: int = 0
    terminated: bool = False
    truncated_by: str | None = None
    infra_failure: dict[str, Any] | None = None
    """The platform's failure, when a turn's outcome was one: the episode is not the model's."""


class SandgymTask(vf.Task[SandgymData, SandgymState, SandgymTaskConfig]):
    @property
    def key(self) -> str:
        # the env is the task: the same spec is the same task on any node
        return task_key(self.data.spec)

    async def setup(self, trace: vf.Trace, runtime: vf.Runtime) -> None:
        if not self.config.url:
            raise ValueError("name the sandgym node: --env.taskset.task.url grpc://HOST:PORT")
        trace.state.node = self.config

    @vf.reward(weight=1.0)
    async def sandgym(self, trace: vf.Trace) -> float:
        state = trace.state
        if state.infra_failure is not None:
            raise vf.SandboxError(f"the sandgym platform failed the episode: {state.infra_failure}")
        return state.episode_return

    @vf.metric
    async def sandgym_turns(self, trace: vf.Trace) -> float:
        return float(trace.state.turns)


class SandgymTaskset(vf.Taskset[SandgymTask, SandgymTasksetConfig]):
    def load(self) -> Iterator[SandgymTask]:
        specs = [{"kind": "task", "path": path} for path in self.config.tasks] + list(self.config.specs)
        if not specs:
            raise ValueError("name the envs: --env.taskset.tasks PATH (under the node's --task-root) or specs")
        for spec in specs:
            name = str(spec.get("path") or spec.get("kind"))
            # the node gives the opening messages when the rollout resets the env
            prompt = f"sandgym env {name}"
            yield SandgymTask(SandgymData(name=name, prompt=prompt, spec=spec), self.config.task)


class SandgymHarness(vf.Harness[vf.HarnessConfig]):
    """A chat loop whose tools run on a sandgym node, in the rollout's process; every model call
    goes through the rollout's interception endpoint."""

    APPENDS_SYSTEM_PROMPT = True
    # the model's commands run in the node's sandbox, never in the runtime
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(
        self,
        ctx: vf.ModelContext,
        trace: vf.Trace,
        runtime: vf.Runtime,
        endpoint: str,
        secret: str,
        mcp_urls: dict[str, str],
        data: vf.TaskData,
        tool_interception_url: str | None = None,
    ) -> vf.ProgramResult:
        state = trace.state
        node = state.node
        token = os.environ.get(node.token_var)
        if not token:
            raise vf.HarnessError(f"${node.token_var} holds no token for the sandgym node")
        options = node.chat.model_dump(exclude_none=True)
        if data.system_prompt is not None:
            options["system_prompt"] = data.system_prompt
        platform = await asyncio.to_thread(Platform.connect, node.url, token, project=node.project)
        try:
            chat = ChatEnv(platform, data.spec, **options)
            try:
                await self._play(chat, state, trace, endpoint, secret)
            finally:
                await asyncio.to_thread(chat.close)
        finally:
            await asyncio.to_thread(platform.close)
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")

    async def _play(self, chat: ChatEnv, state: SandgymState, trace: vf.Trace, endpoint: str, secret: str) -> None:
        messages, _ = await asyncio.to_thread(chat.reset, None, {"episode_id": trace.id})
        state.env_id = chat.env_id
        async with httpx.AsyncClient(timeout=None) as model:
            while True:
                request: dict[str, Any] = {"messages": messages}
                if chat.tools:
                    request["tools"] = chat.tools
                response = await model.post(
                    f"{endpoint}/chat/completions", json=request, headers={"Authorization": f"Bearer {secret}"}
                )
                if response.status_code != 200:
                    if trace.stop_condition is not None:
                        return  # verifiers ended the rollout: a limit or a @stop
                    raise vf.HarnessError(f"the model call failed: {response.status_code} {response.text[:1000]}")
                reply = assistant_reply(response.json()["choices"][0]["message"])
                observations, reward, terminated, truncated, info = await asyncio.to_thread(chat.step, reply)
                messages = [*messages, reply, *observations]
                state.turns += 1
                state.episode_return += reward
                state.terminated = bool(terminated)
                state.truncated_by = info.get("truncatedBy") if truncated else None
                if info["outcome"].get("kind") == "infra_failure":
                    state.infra_failure = info["outcome"]
                    return
                if terminated or truncated:
                    return


def assistant_reply(message: Any) -> dict[str, Any]:
    """The model's reply as the node reads it: its text and its calls. The node reads each call on
    its own, so a malformed one is that call's observation, not an error here."""
    fields = message if isinstance(message, dict) else {}
    content = fields.get("content")
    if isinstance(content, list):
        content = "".join(part.get("text") or "" for part in content if isinstance(part, dict))
    reply: dict[str, Any] = {"role": "assistant", "content": content if isinstance(content, str) else ""}
    calls = fields.get("tool_calls")
    if isinstance(calls, list) and calls:
        reply["tool_calls"] = calls
    return reply


class SandgymEnvConfig(vf.SingleAgentEnvConfig):
    # the harness runs in the rollout's process: the cheapest runtime, left unused
    agent: vf.AgentConfig = vf.AgentConfig(runtime=vf.SubprocessConfig())


class SandgymEnv(vf.SingleAgentEnv, vf.Env[SandgymEnvConfig]):
    """verifiers' single-agent env, whose agent defaults to the subprocess runtime."""
