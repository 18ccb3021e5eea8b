"""sandgym envs as Gymnasium's own classes: `Env` (a `gymnasium.Env`) and `VectorEnv` (a
`gymnasium.vector.VectorEnv`, `next_step` autoreset), with `Text`/`Dict` spaces, registered as
"sandgym/Env-v0" for `gymnasium.make`. Gymnasium (and NumPy) are needed only here: `import
sandgym.gym` works without them, and making an env then says what to install.

Spaces:
- action: Dict(type, command, path, content), each a Text. Only the fields the action's type
  uses are sent (`exec`: command; `write_file`: path, content; `read_file`, `list_dir`: path;
  `submit`: none). A plain map action (`{"type": "exec", "command": "ls", "timeout_ms": 500}`)
  is taken too, as by `sandgym.SandgymEnv`.
- observation: Dict(type, json): the observation's `type`, and the whole observation map as
  JSON text (ASCII, `json.loads` gives the map back): observations differ in shape from one type
  to the next (an exec's output, a file, a directory, a task's instruction), and a language model
  reads text anyway.
"""

from __future__ import annotations

import json
import os
import string
from typing import Any, Mapping, Optional, Sequence, Tuple

from .env import SandgymEnv
from .env import VectorEnv as _SandgymVectorEnv
from .errors import SandgymError
from .platform import Platform

try:
    import gymnasium
    import numpy as np
    from gymnasium import spaces
    from gymnasium.vector import AutoresetMode
    from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate
except ImportError as missing:  # the core client stays stdlib-only
    gymnasium = None
    _MISSING = missing

__all__ = ["ENV_ID", "Env", "VectorEnv", "action_space", "observation_space"]

ENV_ID = "sandgym/Env-v0"

_TYPE_CHARSET = string.ascii_lowercase + "_"
# what json.dumps(ensure_ascii=True) writes: printable ASCII, everything else escaped
_JSON_CHARSET = "".join(chr(c) for c in range(0x20, 0x7F))
_TEXT_CHARSET = _JSON_CHARSET + "\t\n"
# bounds of the spaces, not of the platform: a bigger action still runs (the node caps it), it is
# only outside the space. Kept small where Gymnasium samples (the action space).
_MAX_COMMAND = 4096
_MAX_CONTENT = 65536
_MAX_OBSERVATION = 2**31 - 1
# which fields of a Dict action each action type takes
_FIELDS_OF = {"exec": ("command",), "write_file": ("path", "content"), "read_file": ("path",), "list_dir": ("path",)}


def _need_gymnasium() -> None:
    if gymnasium is None:
        raise SandgymError(
            "unsupported", f"sandgym.gym needs gymnasium and numpy: pip install 'gymnasium>=1.0' ({_MISSING})"
        )


def action_space() -> Any:
    """The action space of an Env: Dict(type, command, path, content) of Text."""
    _need_gymnasium()
    return spaces.Dict(
        {
            "type": spaces.Text(16, min_length=1, charset=_TYPE_CHARSET),
            "command": spaces.Text(_MAX_COMMAND, min_length=0, charset=_TEXT_CHARSET),
            "path": spaces.Text(_MAX_COMMAND, min_length=0, charset=_TEXT_CHARSET),
            "content": spaces.Text(_MAX_CONTENT, min_length=0, charset=_TEXT_CHARSET),
        }
    )


def observation_space() -> Any:
    """The observation space of an Env: Dict(type, json) of Text."""
    _need_gymnasium()
    return spaces.Dict(
        {
            "type": spaces.Text(32, min_length=1, charset=_TYPE_CHARSET),
            "json": spaces.Text(_MAX_OBSERVATION, min_length=2, charset=_JSON_CHARSET),
        }
    )


def sandgym_action(action: Any) -> Any:
    """A Dict-space action as the sandgym action it stands for; any other value as it is."""
    if not isinstance(action, Mapping) or set(action) != {"type", "command", "path", "content"}:
        return action
    kind = str(action["type"])
    return {"type": kind, **{field: str(action[field]) for field in _FIELDS_OF.get(kind, ())}}


def gym_observation(observation: Mapping[str, Any]) -> dict:
    """A sandgym observation map as a point of the observation space."""
    return {"type": str(observation.get("type", "")), "json": json.dumps(observation, ensure_ascii=True)}


def _batched_infos(infos: Sequence[Any]) -> dict:
    """Infos as Gymnasium's vector envs give them: per key an array over the envs and a `_key`
    mask of the envs that have a value. A key whose values are maps for every env is batched
    the same way inside (`infos["outcome"]["kind"]`); other values go as objects (Gymnasium's
    own `_add_info` cannot take a key that is a map for one env and None for another)."""
    batched: dict = {}
    for key in dict.fromkeys(k for info in infos for k in info):
        values = [info.get(key) for info in infos]
        if all(isinstance(v, Mapping) for v in values):
            batched[key] = _batched_infos(values)
        else:
            array = np.empty(len(values), dtype=object)
            array[:] = values
            batched[key] = array
        batched[f"_{key}"] = np.array([v is not None for v in values], dtype=np.bool_)
    return batched


def _platform_of(platform: Optional[Platform], url: Optional[str], token: Optional[str], project: Optional[str]):
    """The platform an env uses, and whether the env made it (and so closes it)."""
    if platform is not None:
        return platform, False
    url = url or os.environ.get("SANDGYM_URL")
    token = token or os.environ.get("SANDGYM_TOKEN")
    if not url or not token:
        raise SandgymError(
            "invalid_argument", "give platform=, or url= and token= (or set $SANDGYM_URL and $SANDGYM_TOKEN)"
        )
    return Platform.connect(url, token, project), True


if gymnasium is not None:

    class Env(gymnasium.Env):
        """One sandgym env (`spec` as for `sandgym.SandgymEnv`) as a `gymnasium.Env`.

        Give `platform=` (a `sandgym.Platform`), or `url=` and `token=` (default $SANDGYM_URL,
        $SANDGYM_TOKEN; the token is read from the environment rather than kept in
        `gymnasium.make`'s kwargs, which Gymnasium copies and prints). `info` is that of
        `sandgym.SandgymEnv`: the same keys on every step, `outcome` among them."""

        metadata: dict = {"render_modes": []}

        def __init__(
            self,
            spec: Mapping[str, Any],
            platform: Optional[Platform] = None,
            url: Optional[str] = None,
            token: Optional[str] = None,
            project: Optional[str] = None,
        ) -> None:
            super().__init__()
            self.action_space = action_space()
            self.observation_space = observation_space()
            self._platform, self._owns_platform = _platform_of(platform, url, token, project)
            self.env = SandgymEnv(self._platform, spec)

        def reset(
            self, *, seed: Optional[int] = None, options: Optional[Mapping[str, Any]] = None
        ) -> Tuple[dict, dict]:
            super().reset(seed=seed)
            observation, info = self.env.reset(seed=seed, options=options)
            return gym_observation(observation), info

        def step(self, action: Any) -> Tuple[dict, float, bool, bool, dict]:
            observation, reward, terminated, truncated, info = self.env.step(sandgym_action(action))
            return gym_observation(observation), reward, terminated, truncated, info

        def close(self) -> None:
            """Destroys the env's sandbox (and the platform connection it made). Idempotent."""
            try:
                self.env.close()
            finally:
                if self._owns_platform:
                    self._platform.close()

    class VectorEnv(gymnasium.vector.VectorEnv):
        """`num_envs` sandgym envs (each in its own sandbox, stepped at once) as a
        `gymnasium.vector.VectorEnv` with `next_step` autoreset: the step after an episode ended
        resets that env (its action is ignored). Observations and actions are batched as Gymnasium
        batches Dict-of-Text spaces (a Dict of tuples); infos as dicts of arrays with `_key` masks."""

        metadata = {"render_modes": [], "autoreset_mode": AutoresetMode.NEXT_STEP}

        def __init__(
            self,
            spec: Mapping[str, Any],
            num_envs: int,
            platform: Optional[Platform] = None,
            url: Optional[str] = None,
            token: Optional[str] = None,
            project: Optional[str] = None,
        ) -> None:
            self.num_envs = num_envs
            self.single_action_space = action_space()
            self.single_observation_space = observation_space()
            self.action_space = batch_space(self.single_action_space, num_envs)
            self.observation_space = batch_space(self.single_observation_space, num_envs)
            self._platform, self._owns_platform = _platform_of(platform, url, token, project)
            self.envs = _SandgymVectorEnv.make(self._platform, spec, num_envs)

        def _batched(self, observations: Sequence[Mapping[str, Any]]) -> Any:
            out = create_empty_array(self.single_observation_space, self.num_envs)
            return concatenate(self.single_observation_space, [gym_observation(o) for o in observations], out)

        def _infos(self, infos: Sequence[Mapping[str, Any]]) -> dict:
            return _batched_infos(infos)

        def reset(
            self, *, seed: Optional[int] = None, options: Optional[Mapping[str, Any]] = None
        ) -> Tuple[Any, dict]:
            if options:
                raise SandgymError("invalid_argument", "VectorEnv.reset takes no options: name episodes per env")
            self._np_random_seed = seed
            observations, infos = self.envs.reset(seed=seed)
            return self._batched(observations), self._infos(infos)

        def step(self, actions: Any) -> Tuple[Any, Any, Any, Any, dict]:
            given = list(iterate(self.action_space, actions)) if isinstance(actions, Mapping) else list(actions)
            observations, rewards, terminated, truncated, infos = self.envs.step([sandgym_action(a) for a in given])
            return (
                self._batched(observations),
                np.array(rewards, dtype=np.float64),
                np.array(terminated, dtype=np.bool_),
                np.array(truncated, dtype=np.bool_),
                self._infos(infos),
            )

        def close_extras(self, **kwargs: Any) -> None:
            try:
                self.envs.close()
            finally:
                if self._owns_platform:
                    self._platform.close()

    # nondeterministic: a step runs real commands in a real sandbox; its info has an episode id
    # and timings, which no seed makes repeat
    if ENV_ID not in gymnasium.registry:
        gymnasium.register(
            ENV_ID, entry_point="sandgym.gym:Env", vector_entry_point="sandgym.gym:VectorEnv", nondeterministic=True
        )

else:

    class Env:  # type: ignore[no-redef]
        """Stands for sandgym.gym.Env where gymnasium is missing: making one says what to install."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            _need_gymnasium()

    class VectorEnv:  # type: ignore[no-redef]
        """Stands for sandgym.gym.VectorEnv where gymnasium is missing."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            _need_gymnasium()
