"""sandgym's chat env as a SkyRL-gym text env (`skyrl_gym.envs.base_text_env.BaseTextEnv`).

    from sandgym.adapters.skyrl import register
    register()  # as "sandgym"
    env = skyrl_gym.make("sandgym", env_config={"url": ..., "token": ...},
                         extras={"spec": {"kind": "task", "path": "hello-file"}})
    prompt, metadata = env.init(dataset_prompt)  # the task's opening messages; tools in metadata
    out = env.step(model_text)  # {"observations": tool messages, "reward", "done", "metadata"}

`env_config` names the node or controller (`url`, `token`, `project`) and how the chat env talks
to the model (`system_prompt`, `max_turns`, `max_tokens`, `format`); `extras`, per sample, the
env (`spec`, or `task`: a path under the node's task root).
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple

from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput
from skyrl_gym.envs.registration import register as _register

from ..chat import ChatEnv
from ..errors import SandgymError
from ..platform import Platform

_CHAT_OPTIONS = ("system_prompt", "instruction", "max_tokens", "format")


def register(env_id: str = "sandgym") -> None:
    """Registers the adapter with SkyRL-gym under `env_id`."""
    _register(id=env_id, entry_point="sandgym.adapters.skyrl:SandgymTextEnv")


class SandgymTextEnv(BaseTextEnv):
    """One episode of a sandgym env per instance, as SkyRL makes one per sample."""

    def __init__(self, env_config: Optional[Mapping[str, Any]] = None, extras: Optional[Mapping[str, Any]] = None) -> None:
        super().__init__()
        config = dict(env_config or {})
        extras = dict(extras or {})
        spec = extras.get("spec") or ({"kind": "task", "path": extras["task"]} if "task" in extras else None)
        if spec is None:
            raise SandgymError("invalid_argument", 'the sample\'s extras name no env: give "spec" or "task"')
        if "url" not in config or "token" not in config:
            raise SandgymError("invalid_argument", 'env_config needs the node\'s "url" and "token"')
        self.max_turns = int(config.get("max_turns", 30))
        self._platform = Platform.connect(config["url"], config["token"], project=config.get("project"))
        options = {key: config[key] for key in _CHAT_OPTIONS if config.get(key) is not None}
        self._chat = ChatEnv(self._platform, spec, max_turns=self.max_turns, **options)

    def init(self, prompt: Optional[List[Dict[str, str]]] = None) -> Tuple[List[dict], Dict[str, Any]]:
        """The episode's opening messages (the dataset's prompt is the task's, told by the node)."""
        messages, info = self._chat.reset()
        self.turns = 0
        return messages, {"tools": self._chat.tools, "episode_id": info.get("episodeId")}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        messages, reward, terminated, truncated, info = self._chat.step(action)
        self.turns += 1
        return BaseTextEnvStepOutput(
            observations=messages,
            reward=reward,
            done=bool(terminated or truncated),
            metadata=info,
        )

    def close(self) -> None:
        try:
            self._chat.close()
        finally:
            self._platform.close()
