"""What the sync and asyncio clients share: requests built from Python arguments, and replies
turned into the shapes Python code reads (float rewards, one set of info keys on every step)."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Tuple

Action = Mapping[str, Any]
Info = dict
StepResult = Tuple[dict, float, bool, bool, dict]

# Action fields that Python code writes in snake_case and the wire spells in camelCase. The
# node's action schema drops fields it does not know, so a `timeout_ms` sent as is would be
# silently ignored: the mapping is what makes the snake_case spelling mean something.
_ACTION_FIELDS = {"timeout_ms": "timeoutMs"}

# Every step's info carries these keys (None when a step has nothing to say), whatever the step
# was: a plain step, a graded submit, a replayed retry or a vector env's autoreset. Code written
# against one step (`info["outcome"]["kind"]`) then works on every step. Keys a newer node adds
# are passed on as well.
STEP_INFO_KEYS = (
    "episodeId",
    "stepIndex",
    "replayed",
    "outcome",
    "signals",
    "startedAt",
    "durationMs",
    "truncatedBy",
    "grade",
    "timeout",
    "autoreset",
    "resetInfo",
)


def wire_action(action: Any) -> Any:
    """The action as the node reads it: snake_case fields renamed to the wire's camelCase.
    Anything that is not a map goes as it is: the node answers it with an `invalid_action`
    observation (a policy's mistake is never an exception). Given both spellings, the camelCase
    one is kept, as the node reads it."""
    if not isinstance(action, Mapping):
        return action
    renamed = {}
    for key, value in action.items():
        wire_key = _ACTION_FIELDS.get(key, key)
        if wire_key != key and wire_key in action:
            continue
        renamed[wire_key] = value
    return renamed


def reset_request(env_id: str, seed: Optional[int], options: Optional[Mapping[str, Any]]) -> dict:
    """An Envs.Reset request; `options` may name the episode as `episode_id` (or `episodeId`)."""
    request: dict = {"envId": env_id}
    if seed is not None:
        request["seed"] = int(seed)
    if options:
        given = dict(options)
        if "episode_id" in given:
            given.setdefault("episodeId", given.pop("episode_id"))
        request["options"] = given
    return request


def step_info(info: Mapping[str, Any], outcome: Mapping[str, Any]) -> dict:
    """A step's info with every key of STEP_INFO_KEYS, the step's outcome among them."""
    shaped = dict.fromkeys(STEP_INFO_KEYS)
    shaped.update(info)
    shaped["outcome"] = dict(outcome)
    shaped["autoreset"] = bool(shaped["autoreset"])
    shaped["replayed"] = bool(shaped["replayed"])
    return shaped


def step_result(reply: Mapping[str, Any]) -> StepResult:
    """(observation, reward, terminated, truncated, info) of an Envs.Step reply; the reward is
    always a float (msgpack carries a whole-number reward as an int)."""
    return (
        reply["observation"],
        float(reply["reward"]),
        bool(reply["terminated"]),
        bool(reply["truncated"]),
        step_info(reply["info"], reply["outcome"]),
    )


def autoreset_result(observation: dict, reset_info: Mapping[str, Any]) -> StepResult:
    """The step of a vector env that only started the next episode (Gymnasium's `next_step`
    autoreset): the new episode's first observation, reward 0.0, and the same info keys as any
    step, the reset's own info under `resetInfo`."""
    info = step_info(
        {"episodeId": reset_info.get("episodeId"), "stepIndex": -1, "autoreset": True, "resetInfo": dict(reset_info)},
        {"kind": "ok"},
    )
    return observation, 0.0, False, False, info


def checkpoint_id(checkpoint: Any) -> str:
    """The id of a checkpoint given as the map a checkpoint call returned, or as its id."""
    if isinstance(checkpoint, Mapping):
        return checkpoint.get("checkpointId") or checkpoint["id"]
    return str(checkpoint)
