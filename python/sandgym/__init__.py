"""sandgym for Python: sandboxes and gym environments on a sandgym node or cluster.

Needs only Debian's python3-grpcio and python3-msgpack. See python/README.md. The same for
asyncio is `sandgym.aio`; Gymnasium's own Env and VectorEnv classes are in `sandgym.gym`.
"""

from ._shapes import STEP_INFO_KEYS
from .env import SandgymEnv, VectorEnv
from .errors import SandgymError
from .platform import DirEntry, ExecResult, Platform, Sandbox
from .wire import tls_credentials

__all__ = ["STEP_INFO_KEYS", "DirEntry", "ExecResult", "Platform", "Sandbox", "SandgymEnv", "SandgymError", "VectorEnv", "tls_credentials"]
