"""Sandboxes through a node agent or a controller: create, attach, exec, files, checkpoint, fork, close."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Mapping, Optional, Sequence, Union

from ._plans import fork_plan, run_plan
from ._shapes import checkpoint_id
from .wire import Wire

Command = Union[str, Sequence[str]]


@dataclass
class ExecResult:
    """What a command did. `exit_code` is None when a signal ended it (see `signal`)."""

    exit_code: Optional[int]
    stdout: str
    stderr: str
    signal: Optional[str] = None
    timed_out: bool = False
    oom_killed: bool = False
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration_ms: float = 0.0


@dataclass
class DirEntry:
    name: str
    type: str
    size: int
    mode: int


def _defined(**fields: Any) -> dict:
    return {key: value for key, value in fields.items() if value is not None}


def exec_request(
    sandbox_id: str,
    command: Command,
    cwd: Optional[str] = None,
    env: Optional[Mapping[str, str]] = None,
    user: Optional[str] = None,
    timeout_ms: Optional[int] = None,
    stdin: Optional[Union[str, bytes]] = None,
) -> dict:
    """An ExecCollected request: a list of program and arguments, or a shell line (`/bin/sh -c`)."""
    argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
    return _defined(sandboxId=sandbox_id, argv=argv, cwd=cwd, env=env, user=user, timeoutMs=timeout_ms, stdin=stdin)


def exec_result(r: Mapping[str, Any]) -> ExecResult:
    return ExecResult(
        exit_code=r["exitCode"],
        stdout=r["stdout"],
        stderr=r["stderr"],
        signal=r.get("signal"),
        timed_out=r.get("timedOut", False),
        oom_killed=r.get("oomKilled", False),
        stdout_truncated=r.get("stdoutTruncated", False),
        stderr_truncated=r.get("stderrTruncated", False),
        duration_ms=r.get("durationMs", 0.0),
    )


def write_request(
    sandbox_id: str, path: str, data: Union[str, bytes], mode: Optional[int] = None, user: Optional[str] = None
) -> dict:
    """A WriteFile request; text goes as UTF-8."""
    payload = data.encode() if isinstance(data, str) else data
    return _defined(sandboxId=sandbox_id, path=path, data=payload, mode=mode, user=user)


def dir_entries(reply: Mapping[str, Any]) -> List[DirEntry]:
    return [DirEntry(e["name"], e["type"], e["size"], e["mode"]) for e in reply["entries"]]


class SandboxInfo:
    """What every sandbox handle, sync or asyncio, knows of its sandbox (the wire's SandboxInfo)."""

    def __init__(self, info: Mapping[str, Any]) -> None:
        self.info = dict(info)
        self.id: str = info["id"]
        self.backend: str = info["backend"]
        self.labels: dict = info.get("labels", {})
        self.resources: dict = info.get("resources", {})


class Sandbox(SandboxInfo):
    """A live sandbox. Closing it destroys it (also on leaving a `with` block)."""

    def __init__(self, wire: Wire, info: Mapping[str, Any]) -> None:
        super().__init__(info)
        self._wire = wire

    def exec(
        self,
        command: Command,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        user: Optional[str] = None,
        timeout_ms: Optional[int] = None,
        stdin: Optional[Union[str, bytes]] = None,
    ) -> ExecResult:
        """Runs a command: a list of program and arguments, or a shell line (`/bin/sh -c`).
        `user` ("name", "uid", "name:group", "uid:gid", as Docker's USER) runs it with that user's
        rights and groups; default root. The file calls below take it too."""
        request = exec_request(self.id, command, cwd, env, user, timeout_ms, stdin)
        return exec_result(self._wire.call("Sandboxes", "ExecCollected", request))

    def read_file(self, path: str, max_bytes: Optional[int] = None, user: Optional[str] = None) -> bytes:
        """A file's bytes."""
        request = _defined(sandboxId=self.id, path=path, maxBytes=max_bytes, user=user)
        return self._wire.call("Sandboxes", "ReadFile", request)["data"]

    def write_file(
        self, path: str, data: Union[str, bytes], mode: Optional[int] = None, user: Optional[str] = None
    ) -> None:
        """Writes bytes (or text, as UTF-8); parent folders are created (as `user`, whose they are)."""
        self._wire.call("Sandboxes", "WriteFile", write_request(self.id, path, data, mode, user))

    def list_dir(self, path: str, user: Optional[str] = None) -> List[DirEntry]:
        request = _defined(sandboxId=self.id, path=path, user=user)
        return dir_entries(self._wire.call("Sandboxes", "ListDir", request))

    def checkpoint(self) -> dict:
        """Saves its processes, memory and files on its node (microVMs, VMs, CRIU containers):
        {"id", "sandboxId", "depth", "sizeBytes", "createdAt"}; `restore` and `fork` take it."""
        return self._wire.call("Sandboxes", "Checkpoint", {"sandboxId": self.id, "depth": "memory"})

    def restore(self, checkpoint: Any) -> None:
        """Goes back to one of its checkpoints (the map `checkpoint` returned, or its id), in place."""
        request = {"sandboxId": self.id, "checkpointId": checkpoint_id(checkpoint)}
        self._wire.call("Sandboxes", "RestoreCheckpoint", request)

    def fork(self, count: int, depth: str = "disk", checkpoint: Optional[Any] = None) -> List["Sandbox"]:
        """`count` new sandboxes that go on from this one, all or none (for group rollouts).
        depth "disk": its files, in new sandboxes anywhere; "memory": its processes and memory too,
        on its node, from `checkpoint` if given, else from a fresh one. Each copy reads a fork
        value of its own in /run/sandgym/fork and $SANDGYM_FORK."""
        infos = run_plan(fork_plan(self.info, count, depth, checkpoint), self._wire.call)
        return [Sandbox(self._wire, info) for info in infos]

    def describe(self) -> dict:
        """Its SandboxInfo now (state, layers, labels), which also refreshes this handle's."""
        info = self._wire.call("Sandboxes", "Describe", {"sandboxId": self.id})
        SandboxInfo.__init__(self, info)
        return info

    def close(self) -> None:
        """Destroys the sandbox. Idempotent."""
        self._wire.call("Sandboxes", "Destroy", {"sandboxId": self.id})

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Platform:
    """A connection to a sandgym node agent or controller."""

    def __init__(self, wire: Wire) -> None:
        self._wire = wire

    @classmethod
    def connect(
        cls,
        url: str,
        token: str,
        project: Optional[str] = None,
        connect_timeout: float = 10.0,
        tls: Any = None,
    ) -> "Platform":
        """Connects to `grpc://HOST:PORT` with a token; `project` applies with a node token.
        `tls` is `sandgym.tls_credentials(ca, cert, key)`; by default $SANDGYM_TLS_CA (and
        $SANDGYM_TLS_CERT, $SANDGYM_TLS_KEY) turn TLS on."""
        return cls(Wire(url, token, project, connect_timeout, tls))

    def create_sandbox(self, request: Optional[Mapping[str, Any]] = None) -> Sandbox:
        """A new sandbox; `request` is a SandboxRequest map (docs/wire.md), e.g. {"environment": "busybox:latest"}."""
        info = self._wire.call("Sandboxes", "Create", {"request": dict(request or {})})
        return Sandbox(self._wire, info)

    def attach_sandbox(self, sandbox_id: str) -> Sandbox:
        """A handle on an existing sandbox of the caller's project (made by another process, say);
        another project's is `not_found`, as a missing one."""
        return Sandbox(self._wire, self._wire.call("Sandboxes", "Describe", {"sandboxId": sandbox_id}))

    def list_sandboxes(self) -> List[dict]:
        return self._wire.call("Sandboxes", "List", {})["sandboxes"]

    def wait_ready(self, timeout: float = 10.0) -> None:
        """Returns once the server answers again (after a restart, say)."""
        self._wire.wait_ready(timeout)

    def close(self) -> None:
        self._wire.close()

    def __enter__(self) -> "Platform":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
