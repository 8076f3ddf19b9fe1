"""utils/allocator.py: glibc's mmap threshold for sharded CPU training, unless the user chose a policy."""
import pytest

from hasten.core import allocator


def test_the_threshold_is_set_when_nobody_chose_one(monkeypatch):
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.delenv("HASTEN_CPU_MMAP_THRESHOLD", raising=False)
    calls = []
    monkeypatch.setattr(allocator.ctypes, "CDLL", lambda name: type("libc", (), {
        "mallopt": staticmethod(lambda option, value: calls.append((option, value)) or 1)}))
    assert allocator.limit_heap_retention() is True
    assert calls == [(-3, allocator.DEFAULT_MMAP_THRESHOLD)]


@pytest.mark.parametrize("variable, value", [("MALLOC_MMAP_THRESHOLD_", "131072"), ("HASTEN_CPU_MMAP_THRESHOLD", "0"),
                                             ("ACCELERATE_CPU_MMAP_THRESHOLD", "0")])
def test_a_users_choice_is_left_alone(monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)
    monkeypatch.setattr(allocator.ctypes, "CDLL", lambda name: pytest.fail("the allocator was changed"))
    assert allocator.limit_heap_retention() is False


def test_a_chosen_threshold_is_used_and_a_bad_one_named(monkeypatch):
    monkeypatch.setenv("HASTEN_CPU_MMAP_THRESHOLD", "1048576")
    calls = []
    monkeypatch.setattr(allocator.ctypes, "CDLL", lambda name: type("libc", (), {
        "mallopt": staticmethod(lambda option, value: calls.append(value) or 1)}))
    assert allocator.limit_heap_retention() and calls == [1048576]
    monkeypatch.setenv("HASTEN_CPU_MMAP_THRESHOLD", "-5")
    with pytest.raises(ValueError, match="HASTEN_CPU_MMAP_THRESHOLD"):
        allocator.limit_heap_retention()


def test_without_glibc_nothing_happens(monkeypatch):
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)

    def missing(name):
        raise OSError("no libc")

    monkeypatch.setattr(allocator.ctypes, "CDLL", missing)
    assert allocator.limit_heap_retention() is False
