"""sandgym's reporter inside pytest, for graders (see src/env/verifiers/harness-report.ts).

pytest loads it through the entry point staged beside it, before any conftest or test module
(and so before any code under test) is imported. It writes one JSON line per event to the report
channel the grader's command inherited ($SANDGYM_REPORT_FD): that pytest started, each session,
each test's result as it happens, and that the interpreter exited normally. The channel is a
pipe the sandbox agent reads as it is written: what was reported cannot be taken back, and a
pytest that never reports its exit (killed, os._exit, a crash, replaced by exec) shows as one that
never finished. Every record carries a token drawn when this process loaded the reporter, so a
process image that replaced this one under the same pid is told apart.

Besides outcomes it reports what the code under test did to the run: a skip, an expected failure
or an exit raised from outside the tests' own files, pytest's or unittest's machinery rewired, and
a plugin registered while the tests were collected or ran.
"""
import atexit
import json
import os
import sys

try:
    _FD = int(os.environ.get('SANDGYM_REPORT_FD', ''))
except ValueError:
    _FD = None
# taken now, before any code under test can replace them
_write = os.write
_dumps = json.dumps
_getpid = os.getpid
_TOKEN = os.urandom(8).hex()
_HERE = os.path.realpath(__file__)
_sessions = []
_counter = [0]
_collecting = [False]
_LIMIT = 3000  # under PIPE_BUF, so each line lands whole even with other writers


def _emit(record):
    if _FD is None:
        return
    record['pid'] = _getpid()
    record['k'] = _TOKEN
    record['d'] = len(_sessions)
    line = _dumps(record, separators=(',', ':'))
    if len(line) > _LIMIT and 'nodeid' in record:
        record['nodeid'] = record['nodeid'][:1000]
        line = _dumps(record, separators=(',', ':'))
    try:
        _write(_FD, (line + '\n').encode('utf-8', 'replace'))
    except OSError:
        pass


_emit({'t': 'load'})
atexit.register(_emit, {'t': 'exit'})


def _current():
    return _sessions[-1] if _sessions else 0


try:
    import pytest

    _hookimpl = pytest.hookimpl
except ImportError:  # imported by a runner of ours where pytest is not installed
    pytest = None

    def _hookimpl(**_options):
        return lambda function: function


# --- where an outcome came from ---------------------------------------------------------------

def _harness_dirs():
    dirs = []
    for name in ('_pytest', 'pytest', 'pluggy', 'unittest'):
        module = sys.modules.get(name)
        path = getattr(module, '__file__', None)
        if path:
            dirs.append(os.path.dirname(os.path.realpath(path)))
    return dirs


def _within(path, folder):
    return path == folder or path.startswith(folder + os.sep)


def _origin(tb):
    """The innermost frame of a traceback outside the test harness: where the outcome was raised."""
    harness = _harness_dirs()
    origin = None
    while tb is not None:
        path = os.path.realpath(tb.tb_frame.f_code.co_filename)
        if path != _HERE and not any(_within(path, d) for d in harness):
            origin = path
        tb = tb.tb_next
    return origin


def _is_tests_own(path, test_file):
    """Whether a file is one of the tests' own: beside the test file, below it, or a conftest."""
    if path is None or test_file is None:
        return True
    return os.path.basename(path) == 'conftest.py' or _within(path, os.path.dirname(os.path.realpath(test_file)))


_DECIDING = ('Skipped', 'XFailed', 'Exit', 'SkipTest')


@_hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    # taken before the inner wrappers run: pytest's own turns a unittest.SkipTest into a skip of
    # its own making, which would hide where the SkipTest was raised
    excinfo = call.excinfo
    outcome = yield
    report = outcome.get_result()
    if excinfo is not None and type(excinfo.value).__name__ in _DECIDING:
        test_file = str(getattr(item, 'path', None) or getattr(item, 'fspath', '') or '') or None
        if not _is_tests_own(_origin(excinfo.tb), test_file):
            report.sandgym_foreign = True


def pytest_collectreport(report):
    if report.failed:
        _emit({'t': 'collect_error', 's': _current(), 'nodeid': report.nodeid})


@_hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    if report.skipped:
        # a whole file skipped: by the test file itself, or from a module it imported
        where = report.longrepr[0] if isinstance(report.longrepr, tuple) and report.longrepr else None
        own = str(getattr(collector, 'path', None) or getattr(collector, 'fspath', '') or '') or None
        foreign = where is not None and not _is_tests_own(os.path.realpath(str(where)), own)
        _emit({'t': 'collect_skip', 's': _current(), 'nodeid': report.nodeid, 'foreign': foreign})


def pytest_runtest_logreport(report):
    record = {
        't': 'test',
        's': _current(),
        'nodeid': report.nodeid,
        'when': report.when,
        'outcome': report.outcome,
        'xfail': hasattr(report, 'wasxfail'),
    }
    if getattr(report, 'sandgym_foreign', False):
        record['foreign'] = True
    _emit(record)


def pytest_keyboard_interrupt(excinfo):
    # pytest.exit(): the session stops before its tests are done, with the exit status it names
    # (collection errors and ^C interrupt too, without deciding an outcome)
    if type(excinfo.value).__name__ == 'Exit':
        _emit({'t': 'interrupted', 's': _current()})


# --- the machinery the code under test must not replace -----------------------------------------

# pytest's, pluggy's and unittest's own modules: their functions, and the classes they define
_WATCHED_MODULES = (
    'pytest', '_pytest.runner', '_pytest.reports', '_pytest.python', '_pytest.terminal',
    '_pytest.main', '_pytest.skipping', '_pytest.outcomes', '_pytest.nodes', '_pytest.unittest',
    '_pytest.fixtures', '_pytest.capture', '_pytest.config', 'pluggy', 'pluggy._hooks',
    'pluggy._manager', 'pluggy._callers', 'unittest.case', 'unittest.result', 'unittest.suite',
    'unittest.loader', 'unittest.runner', __name__,
)
_snapshots = []


def _behaviour(value):
    return callable(value) or isinstance(value, (classmethod, staticmethod, property))


def _holders():
    found = []
    for name in _WATCHED_MODULES:
        module = sys.modules.get(name)
        if module is None:
            continue
        found.append(module)
        found.extend(v for v in list(vars(module).values()) if isinstance(v, type) and v.__module__ == name)
    return found


@_hookimpl(tryfirst=True)
def pytest_collection(session):
    """Before the test modules (and the code under test) are imported: what the machinery is."""
    _collecting[0] = True
    _snapshots.append([(holder, dict(vars(holder))) for holder in _holders()])


def pytest_plugin_registered(plugin, manager):
    """Once collection started, only conftest files and pytest's own may join as plugins."""
    # sessions a test runs inside the run (pytester) register what they like
    if not _collecting[0] or len(_sessions) != 1:
        return
    module = plugin if type(plugin).__name__ == 'module' else type(plugin)
    owner = getattr(module, '__module__', None) or getattr(module, '__name__', '') or ''
    name = manager.get_name(plugin) or ''
    if owner.startswith(('_pytest', 'pytest', 'pluggy')) or owner == __name__:
        return
    if name.endswith('conftest.py') or owner.endswith('conftest'):
        return
    _emit({'t': 'rewired', 's': _current(), 'names': ['plugin %s (%s)' % (name[:200], owner[:200])]})


def _rewired():
    if not _snapshots:
        return []
    # pytest keeps flags of its own on its classes as it runs, which change no result: only a
    # changed or added function, method or class counts
    return sorted(
        '%s.%s' % (getattr(holder, '__name__', holder), name)
        for holder, saved in _snapshots.pop()
        for name, value in list(vars(holder).items())
        if (name in saved and saved[name] is not value and (_behaviour(value) or _behaviour(saved[name])))
        or (name not in saved and isinstance(holder, type) and _behaviour(value))
    )


def pytest_configure(config):
    _counter[0] += 1
    _sessions.append(_counter[0])
    _emit({'t': 'start', 's': _counter[0]})


def pytest_sessionfinish(session, exitstatus):
    rewired = _rewired()
    if rewired:
        _emit({'t': 'rewired', 's': _current(), 'names': rewired[:50]})
    _emit({
        't': 'finish',
        's': _current(),
        'exitstatus': int(exitstatus),
        'failed': getattr(session, 'testsfailed', 0),
        'collected': getattr(session, 'testscollected', 0),
    })


def pytest_unconfigure(config):
    _emit({'t': 'end', 's': _current()})
    if _sessions:
        _sessions.pop()
    if not _sessions:
        _collecting[0] = False


def report_test(test_id, outcome):
    """For runners that are not pytest (unittest, in the SWE-bench runner): one test's outcome."""
    _emit({'t': 'test', 's': 0, 'nodeid': test_id, 'when': 'call', 'outcome': outcome, 'xfail': False})


def report_runner(name, tampered):
    """A runner of sandgym's own finished: what it found rewired in the harness, if anything."""
    _emit({'t': 'runner', 'name': name, 'tampered': list(tampered)[:50]})
