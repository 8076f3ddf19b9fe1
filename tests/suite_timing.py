"""The suite's own timing report, and its time budget on CI.

After every run: the total, the slowest tests in the terminal summary, and every test's time (set-up, call and
tear-down together, slowest first) in ``build/test-durations.txt``. On CI (``CI`` set to a true value) a run whose
whole time passes the budget fails, naming the slowest tests: ``HASTEN_TEST_BUDGET_S`` seconds (default 1500,
25 minutes), counted from ``HASTEN_TEST_STARTED_AT`` (epoch seconds; ``.ci/run`` sets it before building the
environment, so the build counts) or else from the start of the test session.
"""
from __future__ import annotations

import os
import time
from collections import defaultdict
from pathlib import Path

DEFAULT_BUDGET_S = 1500
REPORT = Path(__file__).resolve().parents[1] / "build" / "test-durations.txt"
SHOWN = 15


def _true(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


class SuiteTiming:
    """A pytest plugin: sums each test's phases, reports them, enforces the budget on CI."""

    def __init__(self):
        self.session_started = time.time()
        self.durations: dict = defaultdict(float)

    def started_at(self) -> float:
        value = os.environ.get("HASTEN_TEST_STARTED_AT", "")
        try:
            return float(value)
        except ValueError:
            return self.session_started

    def pytest_runtest_logreport(self, report) -> None:
        self.durations[report.nodeid] += report.duration

    def slowest(self) -> list:
        return sorted(self.durations.items(), key=lambda entry: entry[1], reverse=True)

    def over_budget(self) -> float | None:
        """Seconds past the budget on CI, else None."""
        if not _true(os.environ.get("CI", "")):
            return None
        budget = float(os.environ.get("HASTEN_TEST_BUDGET_S", DEFAULT_BUDGET_S))
        spent = time.time() - self.started_at()
        return spent - budget if spent > budget else None

    def pytest_sessionfinish(self, session, exitstatus) -> None:
        if not self.durations:
            return
        REPORT.parent.mkdir(parents=True, exist_ok=True)
        lines = [f"{seconds:9.2f} s  {nodeid}" for nodeid, seconds in self.slowest()]
        REPORT.write_text(f"# {sum(self.durations.values()):.0f} s in tests, {time.time() - self.started_at():.0f} s "
                          f"in all\n" + "\n".join(lines) + "\n")
        if self.over_budget() is not None and exitstatus == 0:
            session.exitstatus = 1

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.durations:
            return
        write = terminalreporter.write_line
        spent = time.time() - self.started_at()
        write(f"suite time: {spent:.0f} s in all, {sum(self.durations.values()):.0f} s in tests; "
              f"the {SHOWN} slowest (every test: {REPORT}):")
        for nodeid, seconds in self.slowest()[:SHOWN]:
            write(f"  {seconds:7.1f} s  {nodeid}")
        past = self.over_budget()
        if past is not None:
            budget = float(os.environ.get("HASTEN_TEST_BUDGET_S", DEFAULT_BUDGET_S))
            terminalreporter.write_sep("!", f"THE SUITE TOOK {spent:.0f} s: {past:.0f} s PAST ITS CI BUDGET OF "
                                            f"{budget:.0f} s (HASTEN_TEST_BUDGET_S). Make the slowest tests above "
                                            "cheaper (tests/README.md) before adding more.", red=True, bold=True)
