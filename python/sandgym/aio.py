"""sandgym for asyncio: the same Platform, Sandbox, SandgymEnv and VectorEnv as `sandgym`, whose
calls are coroutines. One process drives thousands of envs from one event loop: every call goes
on the platform's one channel (grpc.aio, HTTP/2 streams), with no thread per env.

    async with await Platform.connect(url, token) as platform:
        envs = [SandgymEnv(platform, spec) for _ in range(1000)]
        await asyncio.gather(*(env.reset() for env in envs))
        results = await asyncio.gather(*(env.step(action) for env in envs))
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, List, Mapping, Optional, Sequence, Tuple, Union

from ._chat_turns import (
    Answer,
    ChatStepResult,
    ChatTurns,
    Parser,
    chat_restore_request,
    checkpoint_request,
    fork_episode_ids,
)
from ._plans import Plan
from ._plans import fork_plan
from ._shapes import StepResult, autoreset_result, checkpoint_id, reset_request, step_result, wire_action
from .env import _RECONNECT_S
from .errors import SandgymError
from .platform import Command, DirEntry, ExecResult, SandboxInfo, _defined, dir_entries, exec_request, exec_result, write_request
from .wire import AsyncWire

__all__ = ["ChatEnv", "Platform", "Sandbox", "SandgymEnv", "VectorEnv"]


async def _run_plan(plan: Plan, wire: AsyncWire) -> Any:
    """Drives a plan (see _plans.py), each batch of calls at once."""

    async def one(service: str, method: str, request: dict) -> Union[dict, SandgymError]:
        try:
            return await wire.call(service, method, request)
        except SandgymError as error:
            return error

    replies: Any = None
    while True:
        try:
            batch = plan.send(replies)
        except StopIteration as done:
            return done.value
        replies = list(await asyncio.gather(*(one(*call) for call in batch)))


class Sandbox(SandboxInfo):
    """A live sandbox. Closing it destroys it (also on leaving an `async with` block)."""

    def __init__(self, wire: AsyncWire, info: Mapping[str, Any]) -> None:
        super().__init__(info)
        self._wire = wire

    async def exec(
        self,
        command: Command,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        user: Optional[str] = None,
        timeout_ms: Optional[int] = None,
        stdin: Optional[Union[str, bytes]] = None,
    ) -> ExecResult:
        """Runs a command: a list of program and arguments, or a shell line (`/bin/sh -c`)."""
        request = exec_request(self.id, command, cwd, env, user, timeout_ms, stdin)
        return exec_result(await self._wire.call("Sandboxes", "ExecCollected", request))

    async def read_file(self, path: str, max_bytes: Optional[int] = None, user: Optional[str] = None) -> bytes:
        request = _defined(sandboxId=self.id, path=path, maxBytes=max_bytes, user=user)
        return (await self._wire.call("Sandboxes", "ReadFile", request))["data"]

    async def write_file(
        self, path: str, data: Union[str, bytes], mode: Optional[int] = None, user: Optional[str] = None
    ) -> None:
        await self._wire.call("Sandboxes", "WriteFile", write_request(self.id, path, data, mode, user))

    async def list_dir(self, path: str, user: Optional[str] = None) -> List[DirEntry]:
        request = _defined(sandboxId=self.id, path=path, user=user)
        return dir_entries(await self._wire.call("Sandboxes", "ListDir", request))

    async def checkpoint(self) -> dict:
        """As `sandgym.Sandbox.checkpoint`."""
        return await self._wire.call("Sandboxes", "Checkpoint", {"sandboxId": self.id, "depth": "memory"})

    async def restore(self, checkpoint: Any) -> None:
        """As `sandgym.Sandbox.restore`."""
        request = {"sandboxId": self.id, "checkpointId": checkpoint_id(checkpoint)}
        await self._wire.call("Sandboxes", "RestoreCheckpoint", request)

    async def fork(self, count: int, depth: str = "disk", checkpoint: Optional[Any] = None) -> List["Sandbox"]:
        """As `sandgym.Sandbox.fork`; the copies are made at once."""
        infos = await _run_plan(fork_plan(self.info, count, depth, checkpoint), self._wire)
        return [Sandbox(self._wire, info) for info in infos]

    async def describe(self) -> dict:
        info = await self._wire.call("Sandboxes", "Describe", {"sandboxId": self.id})
        SandboxInfo.__init__(self, info)
        return info

    async def close(self) -> None:
        """Destroys the sandbox. Idempotent."""
        await self._wire.call("Sandboxes", "Destroy", {"sandboxId": self.id})

    async def __aenter__(self) -> "Sandbox":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class Platform:
    """A connection to a sandgym node agent or controller, for asyncio: `await Platform.connect(...)`."""

    def __init__(self, wire: AsyncWire) -> None:
        self._wire = wire

    @classmethod
    async def connect(
        cls, url: str, token: str, project: Optional[str] = None, connect_timeout: float = 10.0, tls: Any = None
    ) -> "Platform":
        """As `sandgym.Platform.connect`, in the running event loop."""
        return cls(await AsyncWire.connect(url, token, project, connect_timeout, tls))

    async def create_sandbox(self, request: Optional[Mapping[str, Any]] = None) -> Sandbox:
        info = await self._wire.call("Sandboxes", "Create", {"request": dict(request or {})})
        return Sandbox(self._wire, info)

    async def attach_sandbox(self, sandbox_id: str) -> Sandbox:
        """As `sandgym.Platform.attach_sandbox`."""
        return Sandbox(self._wire, await self._wire.call("Sandboxes", "Describe", {"sandboxId": sandbox_id}))

    async def list_sandboxes(self) -> List[dict]:
        return (await self._wire.call("Sandboxes", "List", {}))["sandboxes"]

    async def wait_ready(self, timeout: float = 10.0) -> None:
        await self._wire.wait_ready(timeout)

    async def close(self) -> None:
        await self._wire.close()

    async def __aenter__(self) -> "Platform":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class SandgymEnv:
    """As `sandgym.SandgymEnv`, for asyncio: `await env.reset()`, `await env.step(action)`.
    Steps of one env run one after another (each is exactly once, by its index); steps of many
    envs run at once."""

    def __init__(self, platform: Platform, spec: Mapping[str, Any]) -> None:
        self._wire = platform._wire
        self.spec = dict(spec)
        self.env_id: Optional[str] = None
        self._next = 0
        # calls of one env go one at a time: two steps at once would both take the same index
        self._turn = asyncio.Lock()

    async def _ensure(self) -> str:
        if self.env_id is None:
            self.env_id = (await self._wire.call("Envs", "Make", {"spec": self.spec}))["envId"]
        return self.env_id

    async def reset(self, seed: Optional[int] = None, options: Optional[Mapping[str, Any]] = None) -> Tuple[dict, dict]:
        async with self._turn:
            env_id = await self._ensure()
            reply = await self._wire.call("Envs", "Reset", reset_request(env_id, seed, options))
            self._next = 0
            return reply["observation"], reply["info"]

    async def step(self, action: Mapping[str, Any]) -> StepResult:
        """As `sandgym.SandgymEnv.step`. Steps given at once run in the order they were given."""
        async with self._turn:
            if self.env_id is None:
                raise SandgymError("failed_precondition", "Call reset() before step()")
            request = {"envId": self.env_id, "stepIndex": self._next, "action": wire_action(action)}
            reply = await self._call_surviving_restarts("Step", request)
            self._next += 1
            return step_result(reply)

    async def _call_surviving_restarts(self, method: str, request: dict) -> dict:
        deadline = time.monotonic() + _RECONNECT_S
        while True:
            try:
                return await self._wire.call("Envs", method, request)
            except SandgymError as error:
                # as in the sync env: the same index answers with what the step did
                if error.code != "node_lost" or time.monotonic() > deadline:
                    raise
                await self._wire.wait_ready(max(0.1, deadline - time.monotonic()))

    async def checkpoint(self) -> dict:
        return await self._wire.call("Envs", "Checkpoint", {"envId": self.env_id})

    async def restore(self, checkpoint: Any) -> Tuple[dict, dict]:
        async with self._turn:
            request = {"envId": self.env_id, "checkpointId": checkpoint_id(checkpoint)}
            reply = await self._wire.call("Envs", "Restore", request)
            self._next = 0
            return reply["observation"], reply["info"]

    async def close(self) -> None:
        """Destroys the env and its sandbox. Idempotent."""
        if self.env_id is not None:
            env_id, self.env_id = self.env_id, None
            await self._wire.call("Envs", "Close", {"envId": env_id})

    async def __aenter__(self) -> "SandgymEnv":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class VectorEnv:
    """As `sandgym.VectorEnv` (`next_step` autoreset), for asyncio: each call steps every env at once."""

    def __init__(self, envs: Sequence[SandgymEnv]) -> None:
        if not envs:
            raise SandgymError("invalid_argument", "A VectorEnv needs at least one env")
        self.envs = list(envs)
        self._ended = [False] * len(self.envs)

    @classmethod
    def make(cls, platform: Platform, spec: Mapping[str, Any], count: int) -> "VectorEnv":
        return cls([SandgymEnv(platform, spec) for _ in range(count)])

    async def reset(self, seed: Optional[int] = None) -> Tuple[List[dict], List[dict]]:
        results = await asyncio.gather(
            *(env.reset(seed=None if seed is None else seed + i) for i, env in enumerate(self.envs))
        )
        self._ended = [False] * len(self.envs)
        return [r[0] for r in results], [r[1] for r in results]

    async def step(self, actions: Sequence[Mapping[str, Any]]) -> Tuple[list, list, list, list, list]:
        if len(actions) != len(self.envs):
            raise SandgymError(
                "invalid_argument", f"step() needs one action per env: {len(self.envs)}, got {len(actions)}"
            )

        async def one(i: int) -> StepResult:
            if self._ended[i]:
                self._ended[i] = False
                return autoreset_result(*(await self.envs[i].reset()))
            result = await self.envs[i].step(actions[i])
            self._ended[i] = result[2] or result[3]
            return result

        results = await asyncio.gather(*(one(i) for i in range(len(self.envs))))
        return tuple([r[k] for r in results] for k in range(5))  # type: ignore[return-value]

    async def close(self) -> None:
        """Closes every env, all of them even when some fail; then raises the first failure."""
        outcomes = await asyncio.gather(*(env.close() for env in self.envs), return_exceptions=True)
        errors = [o for o in outcomes if isinstance(o, BaseException)]
        if errors:
            raise errors[0]

    async def __aenter__(self) -> "VectorEnv":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class ChatEnv:
    """As `sandgym.chat.ChatEnv`, for asyncio: a trainer's thousands of chat episodes from one
    event loop. Calls of one env run one at a time, in the order they were made."""

    def __init__(
        self,
        platform: Platform,
        spec: Mapping[str, Any],
        *,
        system_prompt: Optional[str] = None,
        instruction: Optional[str] = None,
        max_turns: Optional[int] = None,
        max_tokens: Optional[int] = None,
        format: Optional[str] = None,
        parser: Optional[Parser] = None,
        count_tokens: Optional[Callable[[str], int]] = None,
    ) -> None:
        self._platform = platform
        self._wire = platform._wire
        self.spec = dict(spec)
        self.env_id: Optional[str] = None
        # the checkpoint a fork went on from (`fork` sets it)
        self.forked_from: Optional[dict] = None
        self._turns = ChatTurns(
            system_prompt=system_prompt,
            instruction=instruction,
            max_turns=max_turns,
            max_tokens=max_tokens,
            format=format,
            parser=parser,
            count_tokens=count_tokens,
        )
        self._order = asyncio.Lock()

    @property
    def tools(self) -> List[dict]:
        return self._turns.tools

    async def _ensure(self, beside: Optional[str] = None) -> str:
        if self.env_id is None:
            request: dict = {"spec": self.spec, **({"beside": beside} if beside else {})}
            making = asyncio.ensure_future(self._wire.call("Envs", "Make", request))
            try:
                self.env_id = (await asyncio.shield(making))["envId"]
            except asyncio.CancelledError:
                # cancelled while the node makes it: the env it made is closed once it is known
                making.add_done_callback(self._close_orphan)
                raise
        return self.env_id

    def _close_orphan(self, making: "asyncio.Future[Any]") -> None:
        if not making.cancelled() and making.exception() is None:
            orphan = asyncio.ensure_future(self._wire.call("Envs", "Close", {"envId": making.result()["envId"]}))
            orphan.add_done_callback(lambda done: done.cancelled() or done.exception())

    async def reset(self, seed: Optional[int] = None, options: Optional[Mapping[str, Any]] = None) -> Tuple[List[dict], dict]:
        async with self._order:
            request = self._turns.reset_request(await self._ensure(), seed, options)
            return self._turns.opened(await self._wire.call("Envs", "ChatReset", request))

    async def step(self, answer: Answer, tokens: Optional[int] = None) -> ChatStepResult:
        async with self._order:
            request, parse_error = self._turns.step_request(self.env_id, answer, tokens)
            deadline = time.monotonic() + _RECONNECT_S
            while True:
                try:
                    reply = await self._wire.call("Envs", "ChatStep", request)
                    return self._turns.stepped(reply, parse_error)
                except SandgymError as error:
                    # as in the sync env: the same turn answers with what it did
                    if error.code != "node_lost" or time.monotonic() > deadline:
                        raise
                    await self._wire.wait_ready(max(0.1, deadline - time.monotonic()))

    async def checkpoint(self, depth: Optional[str] = None) -> dict:
        async with self._order:
            return await self._wire.call("Envs", "Checkpoint", checkpoint_request(self.env_id, depth))

    async def restore(self, checkpoint: Any, episode_id: Optional[str] = None) -> Tuple[List[dict], dict]:
        async with self._order:
            request = chat_restore_request(await self._ensure(), checkpoint, episode_id)
            return self._turns.opened(await self._wire.call("Envs", "ChatRestore", request))

    async def fork(self, count: int, episode_ids: Optional[List[str]] = None) -> List["ChatEnv"]:
        """As `sandgym.chat.ChatEnv.fork`; the forks are made at once."""
        names = fork_episode_ids(count, episode_ids)
        saved = await self.checkpoint(depth="disk")
        forks = [ChatEnv(self._platform, self.spec, **self._turns.given) for _ in names]

        async def start(env: ChatEnv, name: Optional[str]) -> None:
            await env._ensure(beside=self.env_id)
            await env.restore(saved, name)
            env.forked_from = saved

        try:
            outcomes = await asyncio.gather(*(start(e, n) for e, n in zip(forks, names)), return_exceptions=True)
        except BaseException:
            # cancelled midway: the forks made so far are closed all the same, and the cancel goes on
            await asyncio.shield(_close_all(forks))
            raise
        failures = [o for o in outcomes if isinstance(o, BaseException)]
        if failures:
            await _close_all(forks)
            raise failures[0]
        return forks

    async def close(self) -> None:
        """Destroys the env and its sandbox. Idempotent."""
        if self.env_id is not None:
            env_id, self.env_id = self.env_id, None
            await self._wire.call("Envs", "Close", {"envId": env_id})

    async def __aenter__(self) -> "ChatEnv":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def _close_all(envs: Sequence[ChatEnv]) -> None:
    """Closes every env given, whatever happens to some of them."""
    await asyncio.gather(*(env.close() for env in envs), return_exceptions=True)
