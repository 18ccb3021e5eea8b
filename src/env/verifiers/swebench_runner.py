"""The test runner sandgym stages into a SWE-bench grader; see swebench.ts for what it guards against."""
import json, sys, unittest
repo, report, ids = sys.argv[1], sys.argv[2], sys.argv[3:]
node_ids = [i for i in ids if '::' in i or i.endswith('.py')]
statuses = {}
dump, write_to = json.dump, open  # kept before any code under test runs

class UnittestRecorder(unittest.TestResult):
    def addSuccess(self, test): statuses[test.id()] = 'passed'
    def addFailure(self, test, err): statuses[test.id()] = 'failed'
    def addError(self, test, err): statuses[test.id()] = 'error'
    def addSkip(self, test, reason): statuses[test.id()] = 'skipped'
    def addExpectedFailure(self, test, err): statuses[test.id()] = 'failed'
    def addUnexpectedSuccess(self, test): statuses[test.id()] = 'failed'

class PytestRecorder:
    def pytest_runtest_logreport(self, report):
        if report.when == 'call':
            statuses[report.nodeid] = report.outcome
        elif report.failed:
            statuses[report.nodeid] = 'error'
        elif report.skipped and report.when == 'setup':
            statuses[report.nodeid] = 'skipped'

# The code under test runs in this process: if it rewires the test machinery, no status counts.
watched = [unittest.TestCase, unittest.TestResult, unittest.TestSuite, unittest.TestLoader,
           UnittestRecorder, PytestRecorder, json]
if node_ids:
    import pytest, _pytest.runner, _pytest.python, _pytest.reports
    watched += [_pytest.runner, _pytest.python.Function, _pytest.reports.TestReport, pytest]
before = [(holder, dict(vars(holder))) for holder in watched]

if node_ids:
    pytest.main(['-q', '-p', 'no:cacheprovider', '--rootdir', repo, *node_ids], plugins=[PytestRecorder()])
sys.path.insert(0, repo)
for test_id in [i for i in ids if i not in node_ids]:
    try:
        unittest.defaultTestLoader.loadTestsFromName(test_id).run(UnittestRecorder())
    except Exception:
        statuses[test_id] = 'error'

# Rewiring is replacing behaviour: a changed or added function, method or class. pytest keeps
# flags of its own on its classes as it runs (_pytest_diamond_inheritance_warning_shown, say),
# which change no result.
def behaviour(value):
    return callable(value) or isinstance(value, (classmethod, staticmethod, property))
tampered = sorted(
    f'{getattr(holder, "__name__", holder)}.{name}'
    for holder, saved in before
    for name, value in vars(holder).items()
    if name in saved and saved[name] is not value and (behaviour(value) or behaviour(saved[name]))
    or name not in saved and isinstance(holder, type) and behaviour(value)
)
if tampered:
    statuses = {test_id: 'error' for test_id in ids}
with write_to(report, 'w') as out:
    dump({'complete': True, 'statuses': statuses, 'harnessTampered': tampered}, out)
