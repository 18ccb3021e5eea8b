from pathlib import Path

from riddle import riddle


def test_riddle():
    assert riddle() == "What has keys but cannot open locks?"


def test_answer():
    assert Path("/app/answer.txt").read_text() == Path("/tests/expected.txt").read_text()
