"""The test runner sandgym stages into a SWE-bench grader; see swebench.ts for what it guards against.

Python runs isolated (-I). The harness (the import guard and the reporter) is imported first, so
no module of the repository stands in for the standard library's or pytest's, and every test's
outcome goes out on the report channel the moment it is known: nothing the code under test does
later (rebinding this module's functions, exiting early) changes what was reported.
"""
import sys

sys.path.insert(0, '/sandgym-runner/py')
import sandgym_import_guard  # noqa: E402

sandgym_import_guard.install()
import sandgym_pytest_report as reporter  # noqa: E402
import unittest  # noqa: E402

repo, ids = sys.argv[1], sys.argv[2:]
node_ids = [i for i in ids if '::' in i or i.endswith('.py')]


class UnittestRecorder(unittest.TestResult):
    def addSuccess(self, test): reporter.report_test(test.id(), 'passed')
    def addFailure(self, test, err): reporter.report_test(test.id(), 'failed')
    def addError(self, test, err): reporter.report_test(test.id(), 'error')
    def addSkip(self, test, reason): reporter.report_test(test.id(), 'skipped')
    def addExpectedFailure(self, test, err): reporter.report_test(test.id(), 'failed')
    def addUnexpectedSuccess(self, test): reporter.report_test(test.id(), 'failed')


# The code under test runs in this process: if it rewires the test machinery, no status counts.
watched = [UnittestRecorder, reporter, sys.modules[__name__]]
for name in ('unittest.case', 'unittest.result', 'unittest.suite', 'unittest.loader', 'unittest.util'):
    module = sys.modules.get(name)
    if module is not None:
        watched += [module] + [v for v in list(vars(module).values()) if isinstance(v, type) and v.__module__ == name]
if node_ids:
    import pytest, _pytest.runner, _pytest.python, _pytest.reports, pluggy  # noqa: E401
    watched += [_pytest.runner, _pytest.python.Function, _pytest.reports.TestReport, pytest, pluggy]
before = [(holder, dict(vars(holder))) for holder in watched]

if node_ids:
    pytest.main(['-q', '-p', 'no:cacheprovider', '-p', 'sandgym_pytest_report', '--rootdir', repo, *node_ids])
sys.path.insert(0, repo)
for test_id in [i for i in ids if i not in node_ids]:
    try:
        unittest.defaultTestLoader.loadTestsFromName(test_id).run(UnittestRecorder())
    except Exception:
        reporter.report_test(test_id, 'error')


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
reporter.report_runner('swebench', tampered)
