import shutil
import sys

import pytest


def test_agent_tests_pass_on_the_correct_implementation():
    assert pytest.main(["-q", "-p", "no:cacheprovider", "/app/test_even.py"]) == 0


def test_agent_tests_catch_a_broken_implementation(tmp_path, monkeypatch):
    (tmp_path / "even.py").write_text("def is_even(n):\n    return True\n")
    shutil.copy("/app/test_even.py", tmp_path / "test_even_mutant.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "even", raising=False)
    assert pytest.main(["-q", "-p", "no:cacheprovider", str(tmp_path / "test_even_mutant.py")]) == 1
