"""Gymnasium-shaped environments served by a sandgym node (the Envs service of docs/wire.md)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, List, Mapping, Optional, Sequence, Tuple

from ._shapes import StepResult, autoreset_result, checkpoint_id, reset_request, step_result, wire_action
from .errors import SandgymError

# how long a step waits for a node that went away to come back before giving up
_RECONNECT_S = 30.0


class SandgymEnv:
    """One environment on the platform, as in Gymnasium: `reset` -> (observation, info), `step`
    -> (observation, reward, terminated, truncated, info), `close`. Actions and observations are
    maps (docs/wire.md, "Steps, exactly once"): {"type": "exec", "command": "ls"}, {"type":
    "write_file", "path": ..., "content": ...}, {"type": "read_file", "path": ...}, {"type":
    "list_dir", "path": ...}, {"type": "submit"}.

    `spec` is {"kind": "sandbox", "sandbox": SandboxRequest} for an env over a fresh sandbox per
    episode, or {"kind": "task", "path": ..., "task": ...} for a task on the node, graded there on
    submit. Each step is one call, run exactly once: a step whose answer was lost (the connection
    dropped) is asked again with the same index once the node is back, and answers with what it did.
    """

    metadata: dict = {"render_modes": []}

    def __init__(self, platform: Any, spec: Mapping[str, Any]) -> None:
        self._wire = platform._wire
        self.spec = dict(spec)
        self.env_id: Optional[str] = None
        self._next = 0

    def _ensure(self) -> str:
        if self.env_id is None:
            self.env_id = self._wire.call("Envs", "Make", {"spec": self.spec})["envId"]
        return self.env_id

    def reset(self, seed: Optional[int] = None, options: Optional[Mapping[str, Any]] = None) -> Tuple[dict, dict]:
        """Starts an episode in a fresh sandbox. `options` may name it: {"episode_id": "..."}."""
        env_id = self._ensure()
        reply = self._wire.call("Envs", "Reset", reset_request(env_id, seed, options))
        self._next = 0
        return reply["observation"], reply["info"]

    def step(self, action: Mapping[str, Any]) -> StepResult:
        """One action. The outcome of the step for the platform is in `info["outcome"]`: an
        `infra_failure` is the platform's fault, never the agent's, and is not a reward. The
        reward is a float; `info` has the same keys on every step (see STEP_INFO_KEYS)."""
        if self.env_id is None:
            raise SandgymError("failed_precondition", "Call reset() before step()")
        request = {"envId": self.env_id, "stepIndex": self._next, "action": wire_action(action)}
        reply = self._call_surviving_restarts("Step", request)
        self._next += 1
        return step_result(reply)

    def _call_surviving_restarts(self, method: str, request: dict) -> dict:
        deadline = time.monotonic() + _RECONNECT_S
        while True:
            try:
                return self._wire.call("Envs", method, request)
            except SandgymError as error:
                # the answer was lost with the connection: the same index answers with what the
                # step did, waits for it, or says it is in doubt; it never runs twice
                if error.code != "node_lost" or time.monotonic() > deadline:
                    raise
                self._wire.wait_ready(max(0.1, deadline - time.monotonic()))

    def checkpoint(self) -> dict:
        """Saves the episode so far on the node; returns a map whose `checkpointId` restores it."""
        return self._wire.call("Envs", "Checkpoint", {"envId": self.env_id})

    def restore(self, checkpoint: Any) -> Tuple[dict, dict]:
        """Goes on from a checkpoint as a new episode: in place at memory depth, else in a new sandbox; (observation, info)."""
        request = {"envId": self.env_id, "checkpointId": checkpoint_id(checkpoint)}
        reply = self._wire.call("Envs", "Restore", request)
        self._next = 0
        return reply["observation"], reply["info"]

    def close(self) -> None:
        """Destroys the env and its sandbox. Idempotent."""
        if self.env_id is not None:
            env_id, self.env_id = self.env_id, None
            self._wire.call("Envs", "Close", {"envId": env_id})

    def __enter__(self) -> "SandgymEnv":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class VectorEnv:
    """Several envs stepped together, each in its own sandbox, their calls in flight at once.
    As in Gymnasium's `next_step` autoreset: the step after an episode ended resets that env
    (its action is ignored) and reports the new episode's first observation with reward 0.0, its
    info carrying `autoreset: True`, the reset's info under `resetInfo`, and the same keys as any
    step's (`outcome` among them)."""

    def __init__(self, envs: Sequence[SandgymEnv]) -> None:
        if not envs:
            raise SandgymError("invalid_argument", "A VectorEnv needs at least one env")
        self.envs = list(envs)
        self._ended = [False] * len(self.envs)
        self._pool = ThreadPoolExecutor(max_workers=len(self.envs))

    @classmethod
    def make(cls, platform: Any, spec: Mapping[str, Any], count: int) -> "VectorEnv":
        return cls([SandgymEnv(platform, spec) for _ in range(count)])

    def reset(self, seed: Optional[int] = None) -> Tuple[List[dict], List[dict]]:
        def one(i: int) -> Tuple[dict, dict]:
            return self.envs[i].reset(seed=None if seed is None else seed + i)

        results = list(self._pool.map(one, range(len(self.envs))))
        self._ended = [False] * len(self.envs)
        return [r[0] for r in results], [r[1] for r in results]

    def step(self, actions: Sequence[Mapping[str, Any]]) -> Tuple[list, list, list, list, list]:
        if len(actions) != len(self.envs):
            raise SandgymError(
                "invalid_argument", f"step() needs one action per env: {len(self.envs)}, got {len(actions)}"
            )

        def one(i: int) -> StepResult:
            if self._ended[i]:
                self._ended[i] = False
                return autoreset_result(*self.envs[i].reset())
            result = self.envs[i].step(actions[i])
            self._ended[i] = result[2] or result[3]
            return result

        results = list(self._pool.map(one, range(len(self.envs))))
        return tuple([r[k] for r in results] for k in range(5))  # type: ignore[return-value]

    def close(self) -> None:
        errors = []
        for env in self.envs:
            try:
                env.close()
            except SandgymError as error:
                errors.append(error)
        self._pool.shutdown(wait=False)
        if errors:
            raise errors[0]

    def __enter__(self) -> "VectorEnv":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
