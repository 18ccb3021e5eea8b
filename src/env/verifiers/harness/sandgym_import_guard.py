"""The import guard sandgym installs in every Python process of a grading run.

The code under test lives in folders that end up first on sys.path (the folder `python -m`
starts in, a script's folder, a folder a test inserts). A module there named like one of the
standard library or of the test harness (pytest.py, _pytest/, unittest.py) would run inside the
harness and could report a pass. With the guard, such names resolve only from the folders the
interpreter started with (the standard library first, then site-packages, then .pth and
PYTHONPATH folders), never from a folder added after start-up; where they are not found there,
the import fails. Every other name resolves as Python always resolves it.
"""
import os
import sys

# the test harness's own distributions, beside the standard library
HARNESS_NAMES = frozenset((
    'pytest', '_pytest', 'py', 'pluggy', 'iniconfig', 'packaging', 'exceptiongroup', 'tomli',
    'attr', 'attrs', 'hypothesis', 'xdist', 'execnet', 'coverage', 'setuptools', 'pkg_resources',
    '_distutils_hack', 'pip', 'wheel', 'importlib_metadata', 'zipp', 'colorama', 'pygments',
    'sandgym_import_guard', 'sandgym_pytest_report', 'sitecustomize', 'usercustomize',
))
HARNESS_PREFIXES = ('pytest_', '_pytest')


def _stdlib_dirs():
    import sysconfig
    paths = sysconfig.get_paths()
    found = []
    for key in ('stdlib', 'platstdlib'):
        if paths.get(key):
            found.append(os.path.realpath(paths[key]))
    return found


def _stdlib_names(stdlib_dirs):
    names = set(getattr(sys, 'stdlib_module_names', ()))
    names.update(sys.builtin_module_names)
    if not getattr(sys, 'stdlib_module_names', None):
        for folder in stdlib_dirs + [os.path.join(d, 'lib-dynload') for d in stdlib_dirs]:
            try:
                entries = os.listdir(folder)
            except OSError:
                continue
            for entry in entries:
                stem = entry.split('.', 1)[0]
                if stem.isidentifier() and entry not in ('site-packages', 'dist-packages'):
                    names.add(stem)
    return names


def _within(path, folders):
    return any(path == folder or path.startswith(folder + os.sep) for folder in folders)


def install(started_with=None):
    """Guards top-level imports of the standard library's and the harness's names."""
    from importlib.machinery import PathFinder
    stdlib_dirs = _stdlib_dirs()
    protected = _stdlib_names(stdlib_dirs) | HARNESS_NAMES
    # the agent's workdir itself, on the path from the start (PYTHONPATH=. in a test script):
    # never trusted for protected names. Folders below it are (a virtual environment a test
    # script makes there holds the pytest it runs).
    untrusted = {os.path.realpath(d) for d in os.environ.get('SANDGYM_UNTRUSTED_DIRS', '').split(':') if d}
    entries = [e for e in (sys.path if started_with is None else started_with) if e]
    real = [(e, os.path.realpath(e)) for e in entries if os.path.realpath(e) not in untrusted]
    stdlib = [e for e, r in real if _within(r, stdlib_dirs) or r.endswith('.zip')]
    sites = [e for e, r in real if os.path.basename(r) in ('site-packages', 'dist-packages') and e not in stdlib]
    others = [e for e, _ in real if e not in stdlib and e not in sites]
    trusted = stdlib + sites + others

    class InterpreterFirst(object):
        """Finds protected names in the folders the interpreter started with, in a safe order."""

        @classmethod
        def find_spec(cls, name, path=None, target=None):
            if path is not None or '.' in name:
                return None
            if name not in protected and not name.startswith(HARNESS_PREFIXES):
                return None
            spec = PathFinder.find_spec(name, trusted, target)
            # a name that merely looks like a plugin's, installed nowhere, is anyone's to have
            if spec is None and name not in protected:
                return None
            if spec is None:
                raise ModuleNotFoundError(
                    'No module named %r where the interpreter keeps its own modules '
                    '(sandgym grading never imports it from the code under test)' % name, name=name)
            return spec

        @classmethod
        def invalidate_caches(cls):
            pass

    at = next((i for i, finder in enumerate(sys.meta_path) if finder is PathFinder), len(sys.meta_path))
    sys.meta_path.insert(at, InterpreterFirst)
