"""Collectives checked by default (tests/collectives/check_safe_collectives.py on 2 processes), and the switch."""
import pytest

from helpers import run_launch
from hasten.utils.environment import patch_environment
from hasten.utils.operations import collective_checks, collective_checks_enabled, set_collective_checks


def test_safe_collectives_two_processes():
    result = run_launch("check_safe_collectives.py", num_processes=2)
    assert "check_safe_collectives OK" in result.stdout


def test_switch_default_on_env_opt_out_and_override():
    with patch_environment(hasten_debug_mode=""):
        assert collective_checks_enabled()
    for variable in ("hasten_debug_mode", "accelerate_debug_mode"):
        for off in ("0", "false", "no"):
            with patch_environment(**{variable: off}):
                assert not collective_checks_enabled()
        with patch_environment(**{variable: "1"}):
            assert collective_checks_enabled()
    with collective_checks(False):
        assert not collective_checks_enabled()
        with collective_checks(True):
            assert collective_checks_enabled()
        assert not collective_checks_enabled()
    assert collective_checks_enabled()
    with pytest.raises(TypeError):
        set_collective_checks("off")
