"""The suite's own tools: the markers read from a test's code (suite_markers.py) and the time budget on CI
(suite_timing.py)."""
import subprocess

from suite_markers import _Reading
from suite_timing import SuiteTiming


def _helper_that_launches():
    return subprocess.run(["true"])


def _calls_the_helper():
    return _helper_that_launches()


def _imports_transformers():
    import transformers  # noqa: F401


def _asks_for_deepspeed(pytest):
    pytest.importorskip("deepspeed")


def _plain():
    return sum(range(3))


def test_a_launch_is_found_through_the_helpers_a_test_calls():
    reading = _Reading()
    assert reading.read(_helper_that_launches) == (True, False)
    assert reading.read(_calls_the_helper) == (True, False)


def test_a_large_library_is_found_in_an_import_and_in_importorskip():
    assert _Reading().read(_imports_transformers) == (False, True)
    assert _Reading().read(_asks_for_deepspeed) == (False, True)
    assert _Reading().read(_plain) == (False, False)


def test_the_budget_fails_a_run_on_ci_only_past_its_seconds(monkeypatch):
    timing = SuiteTiming()
    monkeypatch.setenv("HASTEN_TEST_STARTED_AT", str(timing.session_started - 100))
    monkeypatch.setenv("HASTEN_TEST_BUDGET_S", "50")
    monkeypatch.setenv("CI", "true")
    assert timing.over_budget() >= 50
    monkeypatch.setenv("HASTEN_TEST_BUDGET_S", "500")
    assert timing.over_budget() is None
    monkeypatch.setenv("HASTEN_TEST_BUDGET_S", "50")
    monkeypatch.delenv("CI")
    assert timing.over_budget() is None
