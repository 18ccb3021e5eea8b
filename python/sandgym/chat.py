"""A node's env at the level of chat messages, for trainers that generate with their own engine
(the Envs service's ChatReset, ChatStep and ChatRestore, docs/wire.md "Chat episodes")."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, List, Mapping, Optional, Tuple

from ._chat_turns import (
    Answer,
    ChatStepResult,
    ChatTurns,
    Parser,
    chat_restore_request,
    checkpoint_request,
    fork_episode_ids,
)
from .errors import SandgymError

__all__ = ["Answer", "ChatEnv", "ChatStepResult", "Parser"]

# how long a turn waits for a node that went away to come back before giving up
_RECONNECT_S = 30.0


class ChatEnv:
    """An env that takes the model's answers and gives back chat messages.

    `reset()` -> (messages, info): the system and user messages, with the tools in
    `info["tools"]` (chat-completions form, for the trainer's chat template). `step(answer)` ->
    (messages, reward, terminated, truncated, info): the answer is the model's text or a
    chat-completions message ({"content", "tool_calls"}); every call it makes runs in order on
    the node, and `messages` holds one tool message per call. An answer that cannot be read is an
    observation the model reads, never an exception.

    `spec` is an Envs spec ({"kind": "task", "path": ...} or {"kind": "sandbox", ...}).
    `format` says how text answers hold calls: "auto" (default), "hermes" or "llama3"; `parser`,
    a function of the text that returns [{"name": ..., "arguments": {...}}], reads them here
    instead (what it raises, the model is told it gave no call). `max_turns` and `max_tokens`
    truncate the episode; tokens are what `step(..., tokens=N)` gives, or what `count_tokens`
    counts of each answer and of the messages it answered.

    `fork(n)` saves the episode where it is and gives n new envs that go on from there, each its
    own sandbox on the same node: a GRPO group's rollouts of one task, set up once.
    """

    def __init__(
        self,
        platform: Any,
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

    @property
    def tools(self) -> List[dict]:
        """The tools the model is given, in chat-completions form (after a reset)."""
        return self._turns.tools

    def _ensure(self, beside: Optional[str] = None) -> str:
        if self.env_id is None:
            request: dict = {"spec": self.spec, **({"beside": beside} if beside else {})}
            self.env_id = self._wire.call("Envs", "Make", request)["envId"]
        return self.env_id

    def reset(self, seed: Optional[int] = None, options: Optional[Mapping[str, Any]] = None) -> Tuple[List[dict], dict]:
        """Starts an episode: (messages, info). `options` may name it: {"episode_id": "..."}."""
        request = self._turns.reset_request(self._ensure(), seed, options)
        return self._turns.opened(self._wire.call("Envs", "ChatReset", request))

    def step(self, answer: Answer, tokens: Optional[int] = None) -> ChatStepResult:
        """One turn: (messages, reward, terminated, truncated, info). `info["outcome"]` is the
        platform's verdict on the turn: an `infra_failure` is not the model's doing."""
        request, parse_error = self._turns.step_request(self.env_id, answer, tokens)
        return self._turns.stepped(self._call_surviving_restarts(request), parse_error)

    def checkpoint(self, depth: Optional[str] = None) -> dict:
        """Saves the episode where it is, on the node: a map whose `checkpointId` `restore` takes.
        `depth="disk"` (files) restores into any env of the project, as `fork` does."""
        return self._wire.call("Envs", "Checkpoint", checkpoint_request(self.env_id, depth))

    def restore(self, checkpoint: Any, episode_id: Optional[str] = None) -> Tuple[List[dict], dict]:
        """Goes on with the chat episode a checkpoint saved, in this env, as a new branch:
        (messages, info), the opening messages again; the next turn is `info["turns"]`."""
        request = chat_restore_request(self._ensure(), checkpoint, episode_id)
        return self._turns.opened(self._wire.call("Envs", "ChatRestore", request))

    def fork(self, count: int, episode_ids: Optional[List[str]] = None) -> List["ChatEnv"]:
        """`count` new envs going on from where this episode is (a disk checkpoint of it), made at
        once beside this env, on its node. If one cannot be made, none is kept."""
        names = fork_episode_ids(count, episode_ids)
        saved = self.checkpoint(depth="disk")
        forks = [ChatEnv(self._platform, self.spec, **self._turns.given) for _ in names]

        def start(pair: Tuple["ChatEnv", Optional[str]]) -> None:
            env, name = pair
            env._ensure(beside=self.env_id)
            env.restore(saved, name)
            env.forked_from = saved

        with ThreadPoolExecutor(max_workers=min(count, 16)) as pool:
            outcomes = [pool.submit(start, pair) for pair in zip(forks, names)]
            failures = [o.exception() for o in outcomes if o.exception() is not None]
        if failures:
            for env in forks:
                try:
                    env.close()
                except SandgymError:
                    pass  # the first failure is the one to see
            raise failures[0]  # type: ignore[misc]
        return forks

    def _call_surviving_restarts(self, request: dict) -> dict:
        deadline = time.monotonic() + _RECONNECT_S
        while True:
            try:
                return self._wire.call("Envs", "ChatStep", request)
            except SandgymError as error:
                # the answer was lost with the connection: the same turn answers with its result
                if error.code != "node_lost" or time.monotonic() > deadline:
                    raise
                self._wire.wait_ready(max(0.1, deadline - time.monotonic()))

    def close(self) -> None:
        """Destroys the env and its sandbox. Idempotent."""
        if self.env_id is not None:
            env_id, self.env_id = self.env_id, None
            self._wire.call("Envs", "Close", {"envId": env_id})

    def __enter__(self) -> "ChatEnv":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
