"""Calls that take several round trips (a fork), written once as plans that the sync and the
asyncio clients both drive: a plan yields a batch of calls, gets back each call's reply or its
SandgymError, in order, and returns its result. The sync client runs a batch one call at a
time; the asyncio client runs it at once."""

from __future__ import annotations

import secrets
from typing import Any, Generator, List, Optional, Tuple, Union

from ._shapes import checkpoint_id
from .errors import SandgymError

Call = Tuple[str, str, dict]
Replies = List[Union[dict, SandgymError]]
Plan = Generator[List[Call], Replies, Any]

# where a sandbox's processes read which fork they are (agent/agent.c writes it for memory forks)
_FORK_FILE = "/run/sandgym/fork"


def _raise_first(replies: Replies) -> List[dict]:
    for reply in replies:
        if isinstance(reply, SandgymError):
            raise reply
    return replies  # type: ignore[return-value]


def fork_plan(info: dict, count: int, depth: str, checkpoint: Optional[Any]) -> Plan:
    """`count` new sandboxes that go on from sandbox `info`, all or none; their infos.

    depth "memory": ForkInMemory, on its node (processes and memory too; microVMs, VMs, CRIU
    containers). depth "disk": its files, packed as a layer over its environment, in new sandboxes
    anywhere, each told its own fork value, as the TypeScript client's fork does."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise SandgymError("invalid_argument", f"fork() needs a count of 1 or more, got {count!r}")
    if depth == "memory":
        request = {"sandboxId": info["id"], "count": count}
        if checkpoint is not None:
            request["checkpointId"] = checkpoint_id(checkpoint)
        (reply,) = _raise_first((yield [("Sandboxes", "ForkInMemory", request)]))
        return reply["sandboxes"]
    if depth != "disk":
        raise SandgymError("invalid_argument", f'fork() depth is "disk" or "memory", not {depth!r}')
    if checkpoint is not None:
        raise SandgymError("invalid_argument", 'fork() from a checkpoint needs depth="memory"')
    environment = info.get("labels", {}).get("environment")
    if not environment:
        raise SandgymError(
            "unsupported", f"Sandbox {info['id']} was not made from an environment, so it cannot be forked"
        )
    base, packed = _raise_first(
        (yield [("Sandboxes", "GetEnvironment", {"ref": environment}), ("Sandboxes", "PackDiff", {"sandboxId": info["id"]})])
    )
    # what the source already stacked over its environment (a checkpoint, a grader's diff), then its changes
    extra = [layer["digest"] for layer in info["layers"][len(base["layers"]):]] + [packed["layer"]["digest"]]
    forks = [secrets.token_hex(16) for _ in range(count)]
    run = info.get("labels", {}).get("sandgym.run")
    requests = []
    for fork in forks:
        request = {
            "backend": info["backend"],
            "environment": environment,
            "extraLayers": extra,
            "resources": dict(info["resources"]),
            "env": {"SANDGYM_FORK": fork},
        }
        if run:
            request["run"] = run
        requests.append(("Sandboxes", "Create", {"request": request}))
    created = yield requests
    made = [reply for reply in created if not isinstance(reply, SandgymError)]
    failure = next((reply for reply in created if isinstance(reply, SandgymError)), None)
    if failure is None:
        written = yield [
            ("Sandboxes", "WriteFile", {"sandboxId": sandbox["id"], "path": _FORK_FILE, "data": fork.encode()})
            for sandbox, fork in zip(made, forks)
        ]
        failure = next((reply for reply in written if isinstance(reply, SandgymError)), None)
    if failure is not None:
        yield [("Sandboxes", "Destroy", {"sandboxId": sandbox["id"]}) for sandbox in made]
        raise failure
    return made


def run_plan(plan: Plan, call: Any) -> Any:
    """Drives a plan with a blocking `call(service, method, request)`."""
    replies: Optional[Replies] = None
    while True:
        try:
            batch = plan.send(replies)  # type: ignore[arg-type]
        except StopIteration as done:
            return done.value
        replies = []
        for service, method, request in batch:
            try:
                replies.append(call(service, method, request))
            except SandgymError as error:
                replies.append(error)
