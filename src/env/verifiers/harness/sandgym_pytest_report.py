"""sandgym's reporter inside pytest, for graders (see src/env/verifiers/harness-report.ts).

pytest loads it through the entry point staged beside it, before any conftest or test module
(and so before any code under test) is imported. It writes one JSON line per event to the report
channel the grader's command inherited ($SANDGYM_REPORT_FD): that pytest started, each session,
each test's result as it happens, and that the interpreter exited normally. The channel is a
pipe the sandbox agent reads as it is written: what was reported cannot be taken back, and a
pytest that never reports its exit (killed, os._exit, a crash) shows as one that never finished.
"""
import atexit
import json
import os

try:
    _FD = int(os.environ.get('SANDGYM_REPORT_FD', ''))
except ValueError:
    _FD = None
# taken now, before any code under test can replace them
_write = os.write
_dumps = json.dumps
_getpid = os.getpid
_sessions = []
_counter = [0]
_LIMIT = 3000  # under PIPE_BUF, so each line lands whole even with other writers


def _emit(record):
    if _FD is None:
        return
    record['pid'] = _getpid()
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


def pytest_configure(config):
    _counter[0] += 1
    _sessions.append(_counter[0])
    _emit({'t': 'start', 's': _counter[0]})


def pytest_collectreport(report):
    if report.failed:
        _emit({'t': 'collect_error', 's': _current(), 'nodeid': report.nodeid})


def pytest_runtest_logreport(report):
    _emit({
        't': 'test',
        's': _current(),
        'nodeid': report.nodeid,
        'when': report.when,
        'outcome': report.outcome,
        'xfail': hasattr(report, 'wasxfail'),
    })


# pytest's own machinery, whose behaviour the code under test must not replace while it runs
_WATCHED_MODULES = ('pytest', '_pytest.runner', '_pytest.reports', '_pytest.python', '_pytest.terminal',
                    '_pytest.main', '_pytest.skipping', '_pytest.outcomes', '_pytest.nodes', '_pytest.unittest',
                    '_pytest.fixtures', '_pytest.capture', __name__)
_snapshots = []


def _behaviour(value):
    return callable(value) or isinstance(value, (classmethod, staticmethod, property))


def _holders():
    import sys
    found = []
    for name in _WATCHED_MODULES:
        module = sys.modules.get(name)
        if module is None:
            continue
        found.append(module)
        found.extend(v for v in list(vars(module).values()) if isinstance(v, type) and v.__module__ == name)
    return found


def pytest_collection(session):
    """Before the test modules (and the code under test) are imported: what the machinery is."""
    _snapshots.append([(holder, dict(vars(holder))) for holder in _holders()])


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


def report_test(test_id, outcome):
    """For runners that are not pytest (unittest, in the SWE-bench runner): one test's outcome."""
    _emit({'t': 'test', 's': 0, 'nodeid': test_id, 'when': 'call', 'outcome': outcome, 'xfail': False})


def report_runner(name, tampered):
    """A runner of sandgym's own finished: what it found rewired in the harness, if anything."""
    _emit({'t': 'runner', 'name': name, 'tampered': list(tampered)[:50]})
