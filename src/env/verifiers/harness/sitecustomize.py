"""sitecustomize of a sandgym grading run (staged in a folder on PYTHONPATH, with nothing else
of the code under test beside it): installs the import guard, then runs the image's own
sitecustomize, if it has one, as Python would have without us."""
import os
import sys

import sandgym_import_guard

sandgym_import_guard.install()


def _run_image_sitecustomize():
    from importlib.machinery import PathFinder
    from importlib.util import module_from_spec
    here = os.path.dirname(os.path.realpath(__file__))
    rest = [e for e in sys.path if e and os.path.realpath(e) != here]
    spec = PathFinder.find_spec('sitecustomize', rest)
    if spec is None or spec.loader is None:
        return
    module = module_from_spec(spec)
    sys.modules['sitecustomize'] = module
    spec.loader.exec_module(module)


_run_image_sitecustomize()
