from solution import answer


def test_answer():
    assert answer() == 42


def test_answer_is_an_int():
    assert isinstance(answer(), int)
