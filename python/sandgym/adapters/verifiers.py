"""sandgym's chat env as a `verifiers` taskset (verifiers 0.4, `import verifiers.v1 as vf`).

Its taskset id is "sandgym-verifiers" (verifiers imports a taskset by its id as a top-level
module: `sandgym_verifiers` re-exports this one). Named so, verifiers' own rollout machinery plays
sandgym episodes: its interception server records every model call on the trace, `@vf.reward`
scores, the runtime is torn down.

    import verifiers.v1 as vf

    config = vf.resolve_env_config({"taskset": {
        "id": "sandgym-verifiers",
        "tasks": ["hello-file"],  # paths under the node's --task-root; or "specs": [Envs specs]
        "task": {"url": "grpc://127.0.0.1:7100", "chat": {"max_turns": 10}},  # token: $SANDGYM_TOKEN
    }})
    env = vf.load_environment(config)
    ctx = vf.ModelContext(model="my-model", client=vf.EvalClientConfig(base_url="http://127.0.0.1:8000/v1", api_key_var="VLLM_API_KEY"))
    async with env.serving():
        [task] = list(env.taskset)
        episode = await env.run_slot(env.slots(task)[0], ctx)
    episode.traces[0].reward  # sandgym's verdict

Each rollout makes one env on the node and resets it: its opening messages and tools are the
node's (the task's `prompt` only names it). Every model reply goes to the node as it came
(`tool_calls`, or Hermes/Llama 3 calls in the text); the node's tool messages go back to the
model; the episode's return is the `sandgym` reward. The env and its sandbox are closed when the
rollout's program ends, however it ends. A reply that cannot be read is an observation the model
reads, never an exception; a platform failure (outcome `infra_failure`) fails the rollout instead
of scoring it 0.

`SandgymHarness` is the taskset's bundled harness (verifiers' default for it): a chat loop that
runs in the rollout's own process, so the env's agent defaults to the subprocess runtime, which
it leaves unused. Importing this module does not need verifiers; its classes do, and say so.
"""

from typing import Any

__all__ = ["SandgymEnv", "SandgymEnvConfig", "SandgymHarness", "SandgymTask", "SandgymTaskset", "SandgymTasksetConfig"]


def __getattr__(name: str) -> Any:
    # the classes subclass verifiers' own, so they are made when first asked for
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        import verifiers.v1  # noqa: F401
    except ModuleNotFoundError as error:
        raise ImportError(
            f"sandgym.adapters.verifiers.{name} needs the verifiers package (0.4, whose API is "
            "verifiers.v1): pip install 'verifiers>=0.4,<0.5'"
        ) from error
    from . import _verifiers_taskset

    return getattr(_verifiers_taskset, name)
