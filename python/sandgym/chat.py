"""A node's env at the level of chat messages, for trainers that generate with their own engine
(the Envs service's ChatReset and ChatStep, docs/wire.md "Chat episodes")."""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable, List, Mapping, Optional, Tuple, Union

from ._shapes import reset_request
from .errors import SandgymError

Answer = Union[str, Mapping[str, Any]]
Parser = Callable[[str], Iterable[Mapping[str, Any]]]
ChatStepResult = Tuple[List[dict], float, bool, bool, dict]

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
        self._wire = platform._wire
        self.spec = dict(spec)
        self.env_id: Optional[str] = None
        self.tools: List[dict] = []
        self._parser = parser
        self._count_tokens = count_tokens
        self._turn = 0
        self._shown: List[dict] = []
        options = {
            "systemPrompt": system_prompt,
            "instruction": instruction,
            "maxTurns": max_turns,
            "maxTokens": max_tokens,
            "format": format,
        }
        self._chat = {key: value for key, value in options.items() if value is not None}

    def reset(self, seed: Optional[int] = None, options: Optional[Mapping[str, Any]] = None) -> Tuple[List[dict], dict]:
        """Starts an episode: (messages, info). `options` may name it: {"episode_id": "..."}."""
        if self.env_id is None:
            self.env_id = self._wire.call("Envs", "Make", {"spec": self.spec})["envId"]
        request = dict(reset_request(self.env_id, seed, options), chat=self._chat)
        reply = self._wire.call("Envs", "ChatReset", request)
        self._turn = 0
        self._shown = reply["messages"]
        self.tools = reply["info"].get("tools", [])
        return reply["messages"], reply["info"]

    def step(self, answer: Answer, tokens: Optional[int] = None) -> ChatStepResult:
        """One turn: (messages, reward, terminated, truncated, info). `info["outcome"]` is the
        platform's verdict on the turn: an `infra_failure` is not the model's doing."""
        if self.env_id is None:
            raise SandgymError("failed_precondition", "Call reset() before step()")
        text = answer if isinstance(answer, str) else (answer.get("content") or "")
        parse_error: Optional[str] = None
        if self._parser is not None and isinstance(answer, str):
            answer, parse_error = self._parsed(self._parser, answer)
        if tokens is None and self._count_tokens is not None:
            shown = [m.get("content") or "" for m in self._shown if m.get("role") != "system"]
            tokens = sum(int(self._count_tokens(t)) for t in [text, *shown])
        request: dict = {"envId": self.env_id, "turn": self._turn, "answer": answer}
        if tokens is not None:
            request["tokens"] = int(tokens)
        reply = self._call_surviving_restarts(request)
        self._turn += 1
        self._shown = reply["messages"]
        info = dict(reply["info"])
        info["outcome"] = reply["outcome"]
        if parse_error is not None:
            info["parse_error"] = parse_error
        return reply["messages"], float(reply["reward"]), reply["terminated"], reply["truncated"], info

    def _parsed(self, parser: Parser, text: str) -> Tuple[dict, Optional[str]]:
        """The answer as a message whose calls the caller's parser read, and what it raised."""
        try:
            calls = list(parser(text))
        except Exception as error:  # the parser's failure is the model's observation
            return {"role": "assistant", "content": "", "tool_calls": []}, f"{type(error).__name__}: {error}"
        tool_calls = []
        for index, call in enumerate(calls):
            arguments = call.get("arguments", {}) if isinstance(call, dict) else {}
            tool_calls.append(
                {
                    "id": f"call_{self._turn}_{index}",
                    "type": "function",
                    "function": {"name": str(call.get("name", "")) if isinstance(call, dict) else "", "arguments": arguments},
                }
            )
        # the text was read here: the node reads only the calls
        return {"role": "assistant", "content": "", "tool_calls": tool_calls}, None

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
