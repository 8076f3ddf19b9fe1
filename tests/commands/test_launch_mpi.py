"""``hasten launch`` with ``mpirun_config`` / ``--mpirun_hostfile``: one mpirun starts a multi-CPU job, its processes
take their ranks from MPI's variables. The real job runs under a stand-in ``mpirun`` (this machine has no MPI) that
starts the processes as Intel MPI does, with ``PMI_RANK`` / ``PMI_SIZE`` / ``MPI_LOCALRANKID``."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import yaml

from helpers import ROOT, one_multiprocess_job_at_a_time, clean_env
from launch_fixtures import plan_for, script  # noqa: F401 - pytest fixtures
from hasten.commands import launch_mpi
from hasten.commands.errors import CommandError

FAKE_MPIRUN = textwrap.dedent('''\
    #!{python}
    """A stand-in for Intel MPI's mpirun: -f HOSTFILE -ppn N -n TOTAL PROGRAM..., one machine."""
    import os, subprocess, sys
    args = sys.argv[1:]
    if args == ["--version"]:
        print("Intel(R) MPI Library for Linux* OS, Version 2021.10")
        sys.exit(0)
    with open(os.environ["FAKE_MPIRUN_LOG"], "w") as log:
        log.write(" ".join(args))
    options = dict(zip(args[0:6:2], args[1:6:2]))
    total, program = int(options["-n"]), args[6:]
    children = [subprocess.Popen(program, env={{**os.environ, "PMI_RANK": str(r), "PMI_SIZE": str(total),
                                                 "MPI_LOCALRANKID": str(r)}}) for r in range(total)]
    codes = [child.wait() for child in children]
    sys.exit(next((code for code in codes if code), 0))
''')

WORKER = textwrap.dedent('''\
    import sys
    import torch
    from hasten import Accelerator
    accelerator = Accelerator()
    ranks = accelerator.gather(torch.tensor([accelerator.process_index])).tolist()
    print(f"rank {accelerator.process_index}/{accelerator.num_processes} {accelerator.distributed_type} "
          f"gathered {ranks} args {sys.argv[1:]}", flush=True)
    if "--fail" in sys.argv and accelerator.process_index == 1:
        sys.exit(3)
''')


def _config(tmp_path, hostfile, **extra):
    path = tmp_path / "mpi.yaml"
    path.write_text(yaml.safe_dump({"compute_environment": "LOCAL_MACHINE", "distributed_type": "MULTI_CPU",
                                    "num_machines": 1, "num_processes": 2, "use_cpu": True,
                                    "main_process_ip": "127.0.0.1", "mpirun_config": {"mpirun_hostfile": hostfile},
                                    **extra}))
    return str(path)


@pytest.mark.parametrize("version, expected", [
    (b"mpirun (Open MPI) 4.1.5", ("mpirun", "--hostfile", "-n", "--npernode", "--bind-to")),
    (b"Intel(R) MPI Library for Linux* OS, Version 2021.10", ("mpirun", "-f", "-n", "-ppn", None)),
    (b"HYDRA build details: MPICH 4.1", ("mpirun", "-f", "-n", "-ppn", "--bind-to")),
])
def test_the_mpirun_flavour_decides_its_flags(monkeypatch, version, expected):
    monkeypatch.setattr(launch_mpi.subprocess, "check_output", lambda *a, **k: version)
    assert launch_mpi.mpirun_flavour() == expected


def test_the_plan_is_one_mpirun_over_the_hostfile(monkeypatch, script, tmp_path):
    monkeypatch.setattr(launch_mpi.subprocess, "check_output", lambda *a, **k: b"Intel(R) MPI Library")
    config = yaml.safe_load(open(_config(tmp_path, "/etc/hosts.mpi", num_machines=4, num_processes=16,
                                         machine_rank=0, main_process_port=29500)))
    plan = plan_for([script, "--lr", "1"], config=config)
    assert plan.mpi_runner.argv == ["mpirun", "-f", "/etc/hosts.mpi", "-ppn", "4", "-n", "16", sys.executable,
                                    script, "--lr", "1"]
    assert plan.mpi_runner.env["MASTER_ADDR"] == "127.0.0.1" and plan.mpi_runner.env["HASTEN_USE_CPU"] == "true"
    flagged = plan_for(["--cpu", "-n", "2", "--mpirun_hostfile", "hosts", "-m", "json.tool"])
    assert flagged.mpi_runner.argv[:7] == ["mpirun", "-f", "hosts", "-ppn", "2", "-n", "2"]
    assert flagged.mpi_runner.argv[7:] == [sys.executable, "-m", "json.tool"]
    assert plan_for(["--cpu", "-n", "2", script]).mpi_runner is None  # no hostfile: torchrun's agent


def test_mpi_without_mpirun_or_for_accelerators_is_refused_before_anything_starts(monkeypatch, script):
    def missing(*args, **kwargs):
        raise FileNotFoundError("mpirun")

    monkeypatch.setattr(launch_mpi.subprocess, "check_output", missing)
    with pytest.raises(CommandError, match="mpirun executable not found"):
        plan_for(["--cpu", "--mpirun_hostfile", "hosts", script])
    with pytest.raises(CommandError, match="multi-CPU jobs: add --cpu"):
        plan_for(["--mpirun_hostfile", "hosts", script])


def test_an_mpi_job_runs_with_the_ranks_mpi_gives(tmp_path):
    mpirun = tmp_path / "bin" / "mpirun"
    mpirun.parent.mkdir()
    mpirun.write_text(FAKE_MPIRUN.format(python=sys.executable))
    mpirun.chmod(0o755)
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost\n")
    config = _config(tmp_path, str(hostfile))
    env = clean_env(FAKE_MPIRUN_LOG=str(tmp_path / "mpirun.log"))
    env["PATH"] = f"{mpirun.parent}{os.pathsep}{env['PATH']}"
    command = [sys.executable, "-m", "hasten", "launch", "--config_file", config, str(worker), "--x", "1"]
    with one_multiprocess_job_at_a_time():
        result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=240)
        failed = subprocess.run(command + ["--fail"], capture_output=True, text=True, env=env, cwd=ROOT,
                                timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in (0, 1):
        assert f"rank {rank}/2 DistributedType.MULTI_CPU gathered [0, 1] args ['--x', '1']" in result.stdout
    assert (tmp_path / "mpirun.log").read_text().startswith(f"-f {hostfile} -ppn 2 -n 2 {sys.executable}")
    assert failed.returncode == 3, failed.stdout + failed.stderr  # a failing process fails the launch
