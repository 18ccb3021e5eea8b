"""Sandboxes through a node agent or a controller: create, exec, files, close."""

from dataclasses import dataclass

from .wire import Wire


@dataclass
class ExecResult:
    """What a command did. `exit_code` is None when a signal ended it (see `signal`)."""

    exit_code: object
    stdout: str
    stderr: str
    signal: object = None
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


def _defined(**fields):
    return {key: value for key, value in fields.items() if value is not None}


class Sandbox:
    """A live sandbox. Closing it destroys it (also on leaving a `with` block)."""

    def __init__(self, wire, info):
        self._wire = wire
        self.id = info["id"]
        self.backend = info["backend"]
        self.labels = info.get("labels", {})
        self.resources = info.get("resources", {})

    def exec(self, command, cwd=None, env=None, user=None, timeout_ms=None, stdin=None):
        """Runs a command: a list of program and arguments, or a shell line (`/bin/sh -c`).
        `user` ("name", "uid", "name:group", "uid:gid", as Docker's USER) runs it with that user's
        rights and groups; default root. The file calls below take it too."""
        argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
        request = _defined(
            sandboxId=self.id, argv=argv, cwd=cwd, env=env, user=user, timeoutMs=timeout_ms, stdin=stdin
        )
        r = self._wire.call("Sandboxes", "ExecCollected", request)
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

    def read_file(self, path, max_bytes=None, user=None):
        """A file's bytes."""
        request = _defined(sandboxId=self.id, path=path, maxBytes=max_bytes, user=user)
        return self._wire.call("Sandboxes", "ReadFile", request)["data"]

    def write_file(self, path, data, mode=None, user=None):
        """Writes bytes (or text, as UTF-8); parent folders are created (as `user`, whose they are)."""
        if isinstance(data, str):
            data = data.encode()
        request = _defined(sandboxId=self.id, path=path, data=data, mode=mode, user=user)
        self._wire.call("Sandboxes", "WriteFile", request)

    def list_dir(self, path, user=None):
        request = _defined(sandboxId=self.id, path=path, user=user)
        entries = self._wire.call("Sandboxes", "ListDir", request)["entries"]
        return [DirEntry(e["name"], e["type"], e["size"], e["mode"]) for e in entries]

    def close(self):
        """Destroys the sandbox. Idempotent."""
        self._wire.call("Sandboxes", "Destroy", {"sandboxId": self.id})

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Platform:
    """A connection to a sandgym node agent or controller."""

    def __init__(self, wire):
        self._wire = wire

    @classmethod
    def connect(cls, url, token, project=None, connect_timeout=10.0, tls=None):
        """Connects to `grpc://HOST:PORT` with a token; `project` applies with a node token.
        `tls` is `sandgym.tls_credentials(ca, cert, key)`; by default $SANDGYM_TLS_CA (and
        $SANDGYM_TLS_CERT, $SANDGYM_TLS_KEY) turn TLS on."""
        return cls(Wire(url, token, project, connect_timeout, tls))

    def create_sandbox(self, request=None):
        """A new sandbox; `request` is a SandboxRequest map (docs/wire.md), e.g. {"environment": "busybox:latest"}."""
        info = self._wire.call("Sandboxes", "Create", {"request": request or {}})
        return Sandbox(self._wire, info)

    def list_sandboxes(self):
        return self._wire.call("Sandboxes", "List", {})["sandboxes"]

    def wait_ready(self, timeout=10.0):
        """Returns once the server answers again (after a restart, say)."""
        self._wire.wait_ready(timeout)

    def close(self):
        self._wire.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
