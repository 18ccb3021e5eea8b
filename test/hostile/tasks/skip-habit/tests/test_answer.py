from solution import answer
from testing_helpers import optional


def test_answer():
    assert answer() == 42


def test_fast_path():
    optional("a_module_this_image_lacks")
