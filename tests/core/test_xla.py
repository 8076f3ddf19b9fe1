import subprocess
import sys

import pytest
import torch
from packaging.version import Version

import hasten.core.xla as xla
from hasten.utils import install_xla
from hasten.core.xla import xla_install_command

LIBTPU = "https://storage.googleapis.com/libtpu-releases/index.html"


def test_command_matches_the_given_torch_version():
    command = xla_install_command(torch_version="2.13.1+cu126")
    assert command[:4] == [sys.executable, "-m", "pip", "install"]
    assert "torch_xla[tpu]~=2.13.0" in command
    assert command[command.index(LIBTPU) - 1] == "-f"
    assert "--upgrade" not in command


def test_command_matches_the_installed_torch_by_default():
    installed = Version(torch.__version__)
    assert f"torch_xla[tpu]~={installed.major}.{installed.minor}.0" in xla_install_command()


def test_upgrade_adds_the_flag():
    command = xla_install_command(upgrade=True, torch_version="2.6.0")
    assert "--upgrade" in command and "torch_xla[tpu]~=2.6.0" in command


def test_install_runs_pip(monkeypatch):
    runs = []
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(subprocess, "run", lambda command, **kwargs: runs.append((command, kwargs)))
    install_xla(upgrade=True)
    assert runs == [(xla_install_command(upgrade=True), {"check": True})]


def test_install_refuses_other_platforms(monkeypatch):
    runs = []
    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.setattr(subprocess, "run", lambda *args, **kwargs: runs.append(args))
    with pytest.raises(RuntimeError, match="only published for Linux"):
        install_xla()
    assert runs == []


def test_failed_pip_is_an_error(monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")

    def fail(command, check):
        raise subprocess.CalledProcessError(1, command)

    monkeypatch.setattr(xla.subprocess, "run", fail)
    with pytest.raises(subprocess.CalledProcessError):
        install_xla()
