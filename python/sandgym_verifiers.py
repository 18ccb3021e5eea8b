"""The verifiers taskset "sandgym-verifiers": verifiers imports a taskset by its id, as a top-level
module. It is sandgym.adapters.verifiers, which says how to use it."""

from sandgym.adapters.verifiers import *  # noqa: F403
from sandgym.adapters.verifiers import __all__  # noqa: F401
