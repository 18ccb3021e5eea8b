"""The published harnesses' verdicts on recorded outputs, for test/unit/harness-golden.test.ts.

Reads {"cases": [...]} on stdin and writes {"python": ..., "results": {id: ...}} on stdout, all
cases in one process. Each case names its harness:

- "pytest": Terminal-Bench's PytestParser on a run's output, and its harness's resolved rule.
- "swebench": swebench's log parser for the repository (MAP_REPO_TO_PARSER_PY), its tests report
  and resolution status.
- "reward": Harbor's verifier reading /logs/verifier/reward.txt or reward.json.
- "harbor-task": Harbor's TaskConfig validating a task.toml.
- "tb-task": Terminal-Bench's Task model loading a task.yaml.

The harnesses' modules run as published. Two packages' __init__ are not run: terminal_bench's
imports its whole runner (LLM clients, Docker, a database) and, on Python 3.11, does not compile
(PEP 701 f-strings in terminal_bench/harness/harness.py); swebench.harness's imports Docker and
Modal clients. Their parsers and models import neither. harbor.verifier.verifier needs Python 3.12
(typing.override, PEP 701 f-strings): on 3.11 its cases come back {"unavailable": why}.
"""
import contextlib
import importlib
import importlib.util
import json
import os
import sys
import tempfile
import warnings
from pathlib import Path

# litellm, should anything import it, would fetch a price list from the internet
os.environ.setdefault('LITELLM_LOCAL_MODEL_COST_MAP', 'True')
warnings.simplefilter('ignore')  # Harbor warns of deprecated task.toml fields: not a verdict


def without_package_init(package):
    """Makes `package` importable from without running its __init__ (see the module's doc)."""
    spec = importlib.util.find_spec(package)
    sys.modules[package] = importlib.util.module_from_spec(spec)


without_package_init('terminal_bench')
without_package_init('swebench.harness')

from terminal_bench.parsers.base_parser import UnitTestStatus  # noqa: E402
from terminal_bench.parsers.pytest_parser import PytestParser  # noqa: E402
from terminal_bench.handlers.trial_handler import Task as TerminalBenchTask  # noqa: E402
from swebench.harness.constants import FAIL_TO_PASS, PASS_TO_PASS, ResolvedStatus  # noqa: E402
from swebench.harness.grading import get_eval_tests_report, get_resolution_status  # noqa: E402
from swebench.harness.log_parsers.python import MAP_REPO_TO_PARSER_PY  # noqa: E402
from harbor.models.task.config import TaskConfig  # noqa: E402
from harbor.models.trial.paths import TrialPaths  # noqa: E402
from harbor.models.verifier.result import VerifierResult  # noqa: E402

try:
    from harbor.verifier.verifier import Verifier as HarborVerifier
    harbor_verifier_missing = None
except SyntaxError as error:  # Python < 3.12
    HarborVerifier = None
    harbor_verifier_missing = f'harbor.verifier.verifier needs Python >= 3.12 ({error.msg})'


def pytest_case(case):
    try:
        parsed = PytestParser().parse(case['output'])
    except ValueError:
        # the harness's _parse_results: no summary is a parse error, and no results unresolved
        return {'summary': False, 'resolved': False}
    tests = {name: status.value for name, status in parsed.items()}
    # Harness._is_resolved (terminal_bench/harness/harness.py), whose module cannot be imported here
    resolved = all(status == UnitTestStatus.PASSED for status in parsed.values())
    return {'summary': True, 'tests': tests, 'resolved': resolved}


def swebench_case(case):
    status_map = MAP_REPO_TO_PARSER_PY[case['repo']](case['log'], None)
    gold = {FAIL_TO_PASS: case['FAIL_TO_PASS'], PASS_TO_PASS: case['PASS_TO_PASS']}
    report = get_eval_tests_report(status_map, gold)
    return {
        'statuses': status_map,
        'failToPass': report[FAIL_TO_PASS],
        'passToPass': report[PASS_TO_PASS],
        'resolved': get_resolution_status(report) == ResolvedStatus.FULL.value,
    }


class TrialOfFiles:
    """What Verifier's reward readers use of a verifier: where the trial's files are."""

    def __init__(self, trial_dir):
        self.trial_paths = TrialPaths(trial_dir)


def reward_case(case):
    if HarborVerifier is None:
        return {'unavailable': harbor_verifier_missing}
    with tempfile.TemporaryDirectory() as trial_dir:
        trial = TrialOfFiles(Path(trial_dir))
        trial.trial_paths.verifier_dir.mkdir()
        for name, text in case['files'].items():
            (trial.trial_paths.verifier_dir / name).write_text(text)
        try:
            # Verifier.verify's choice, after the run it cannot make here: reward.json first
            if trial.trial_paths.reward_json_path.exists():
                rewards = HarborVerifier._parse_reward_json(trial)
            else:
                rewards = HarborVerifier._parse_reward_text(trial)
            return {'rewards': VerifierResult(rewards=rewards).rewards}
        except Exception as error:  # the harness's own refusal: the verdict under test
            return {'error': f'{type(error).__name__}: {error}'}


def harbor_task_case(case):
    try:
        config = TaskConfig.model_validate_toml(case['toml'])
    except Exception as error:
        return {'error': f'{type(error).__name__}: {error}'.splitlines()[0]}
    return {
        'verifierTimeoutSec': config.verifier.timeout_sec,
        'agentTimeoutSec': config.agent.timeout_sec,
        'cpus': config.environment.cpus,
        'memoryMb': config.environment.memory_mb,
        'storageMb': config.environment.storage_mb,
        'dockerImage': config.environment.docker_image,
        'network': {
            'environment': config.environment.network_mode.value,
            'agent': config.agent.network_mode and config.agent.network_mode.value,
            'verifier': config.verifier.network_mode and config.verifier.network_mode.value,
        },
        'env': config.environment.env,
        'verifierEnv': config.verifier.env,
        'solutionEnv': config.solution.env,
        'workdir': config.environment.workdir,
        'healthcheck': config.environment.healthcheck and {
            'command': config.environment.healthcheck.command,
            'intervalMs': config.environment.healthcheck.interval_sec * 1000,
            'timeoutMs': config.environment.healthcheck.timeout_sec * 1000,
            'startPeriodMs': config.environment.healthcheck.start_period_sec * 1000,
            'startIntervalMs': config.environment.healthcheck.start_interval_sec * 1000,
            'retries': config.environment.healthcheck.retries,
        },
        # model_dump leaves out empty headers
        'mcpServers': [
            {**server.model_dump(), 'headers': server.headers} for server in config.environment.mcp_servers
        ],
    }


def tb_task_case(case):
    try:
        # from_yaml prints its complaint to stdout, which carries this script's answer
        with contextlib.redirect_stdout(sys.stderr):
            task = TerminalBenchTask.from_yaml(Path(case['path']))
    except Exception as error:
        return {'error': f'{type(error).__name__}: {error}'.splitlines()[0]}
    return {
        'instruction': task.instruction,
        'parser': task.parser_name.value,
        'maxAgentTimeoutSec': task.max_agent_timeout_sec,
        'maxTestTimeoutSec': task.max_test_timeout_sec,
    }


KINDS = {
    'pytest': pytest_case,
    'swebench': swebench_case,
    'reward': reward_case,
    'harbor-task': harbor_task_case,
    'tb-task': tb_task_case,
}

cases = json.load(sys.stdin)['cases']
results = {case['id']: KINDS[case['kind']](case) for case in cases}
json.dump({'python': sys.version.split()[0], 'results': results}, sys.stdout)
