"""What the sync and asyncio chat envs share: the requests of a chat episode built from Python
arguments, and its replies read into what trainers take (float rewards, `outcome` in info). The
two envs only make the calls, so they cannot drift apart."""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple, Union

from ._shapes import checkpoint_id, reset_request
from .errors import SandgymError

Answer = Union[str, Mapping[str, Any]]
Parser = Callable[[str], Iterable[Mapping[str, Any]]]
ChatStepResult = Tuple[List[dict], float, bool, bool, dict]

_DEPTHS = ("disk", "memory")
_WIRE_NAMES = {
    "system_prompt": "systemPrompt",
    "instruction": "instruction",
    "max_turns": "maxTurns",
    "max_tokens": "maxTokens",
    "format": "format",
}


class ChatTurns:
    """One chat env's side of its episode: the options it was made with, the next turn's index,
    the messages the model was last shown (what `count_tokens` counts), and the tools."""

    def __init__(
        self,
        *,
        system_prompt: Optional[str],
        instruction: Optional[str],
        max_turns: Optional[int],
        max_tokens: Optional[int],
        format: Optional[str],
        parser: Optional[Parser],
        count_tokens: Optional[Callable[[str], int]],
    ) -> None:
        self.parser = parser
        self.count_tokens = count_tokens
        self.turn = 0
        self.shown: List[dict] = []
        self.tools: List[dict] = []
        # what a fork is made with: the same options, so its turns read and count alike
        self.given: Dict[str, Any] = dict(
            system_prompt=system_prompt,
            instruction=instruction,
            max_turns=max_turns,
            max_tokens=max_tokens,
            format=format,
            parser=parser,
            count_tokens=count_tokens,
        )
        # the ones the node reads, in the wire's spelling
        self.wire_options = {
            _WIRE_NAMES[key]: value for key, value in self.given.items() if key in _WIRE_NAMES and value is not None
        }

    def reset_request(self, env_id: str, seed: Optional[int], options: Optional[Mapping[str, Any]]) -> dict:
        return dict(reset_request(env_id, seed, options), chat=self.wire_options)

    def opened(self, reply: Mapping[str, Any]) -> Tuple[List[dict], dict]:
        """Reads a ChatReset or ChatRestore reply; the next turn is the turns spent so far."""
        info = dict(reply["info"])
        self.turn = int(info.get("turns") or 0)
        self.shown = reply["messages"]
        self.tools = info.get("tools", [])
        return reply["messages"], info

    def step_request(self, env_id: Optional[str], answer: Answer, tokens: Optional[int]) -> Tuple[dict, Optional[str]]:
        """The ChatStep request of `answer`, and what the caller's parser raised, if it did."""
        if env_id is None:
            raise SandgymError("failed_precondition", "Call reset() before step()")
        text = answer if isinstance(answer, str) else (answer.get("content") or "")
        parse_error: Optional[str] = None
        if self.parser is not None and isinstance(answer, str):
            answer, parse_error = self._parsed(answer)
        if tokens is None and self.count_tokens is not None:
            shown = [m.get("content") or "" for m in self.shown if m.get("role") != "system"]
            tokens = sum(int(self.count_tokens(t)) for t in [text, *shown])
        request: dict = {"envId": env_id, "turn": self.turn, "answer": answer}
        if tokens is not None:
            request["tokens"] = int(tokens)
        return request, parse_error

    def stepped(self, reply: Mapping[str, Any], parse_error: Optional[str]) -> ChatStepResult:
        self.turn += 1
        self.shown = reply["messages"]
        info = dict(reply["info"])
        info["outcome"] = reply["outcome"]
        if parse_error is not None:
            info["parse_error"] = parse_error
        return reply["messages"], float(reply["reward"]), reply["terminated"], reply["truncated"], info

    def _parsed(self, text: str) -> Tuple[dict, Optional[str]]:
        """The answer as a message whose calls the caller's parser read, and what it raised."""
        assert self.parser is not None
        try:
            calls = list(self.parser(text))
        except Exception as error:  # the parser's failure is the model's observation
            return {"role": "assistant", "content": "", "tool_calls": []}, f"{type(error).__name__}: {error}"
        tool_calls = []
        for index, call in enumerate(calls):
            arguments = call.get("arguments", {}) if isinstance(call, dict) else {}
            tool_calls.append(
                {
                    "id": f"call_{self.turn}_{index}",
                    "type": "function",
                    "function": {"name": str(call.get("name", "")) if isinstance(call, dict) else "", "arguments": arguments},
                }
            )
        # the text was read here: the node reads only the calls
        return {"role": "assistant", "content": "", "tool_calls": tool_calls}, None


def checkpoint_request(env_id: Optional[str], depth: Optional[str]) -> dict:
    if env_id is None:
        raise SandgymError("failed_precondition", "Nothing to checkpoint: call reset() first")
    if depth is not None and depth not in _DEPTHS:
        raise SandgymError("invalid_argument", f"depth must be one of {', '.join(_DEPTHS)}, got {depth!r}")
    return {"envId": env_id, **({"depth": depth} if depth else {})}


def chat_restore_request(env_id: str, checkpoint: Any, episode_id: Optional[str]) -> dict:
    request: dict = {"envId": env_id, "checkpointId": checkpoint_id(checkpoint)}
    if episode_id is not None:
        request["options"] = {"episodeId": episode_id}
    return request


def fork_episode_ids(count: int, episode_ids: Optional[List[str]]) -> List[Optional[str]]:
    """One episode id (or None: the node names it) per fork, checked before anything is made."""
    if not isinstance(count, int) or count < 1:
        raise SandgymError("invalid_argument", f"fork() needs a count of 1 or more, got {count!r}")
    if episode_ids is None:
        return [None] * count
    if len(episode_ids) != count:
        raise SandgymError("invalid_argument", f"fork() needs one episode id per fork: {count}, got {len(episode_ids)}")
    return list(episode_ids)
