"""`python train.py` on each worker, with exactly the variables an engine sets and no launcher: a Kubeflow
PyTorchJob (one process per pod, its config file named by HASTEN_CONFIG_FILE: FSDP2 from the file's backend section)
and SLURM's `srun` (ranks from SLURM_PROCID ..., the main address from the node list, the port from the job id) form
one job of two processes. Where each variable comes from: docs/engines.md."""
from __future__ import annotations

import socket
import subprocess
import sys

from helpers import clean_env, one_multiprocess_job_at_a_time, script_path


def _free_port_from(low: int, high: int) -> int:
    for port in range(low, high):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {low}-{high}")


def _run_pair(variables_of, folder) -> list[str]:
    script = str(script_path("check_engine_variables.py"))
    with one_multiprocess_job_at_a_time():
        processes = [subprocess.Popen([sys.executable, script, str(folder)], env=clean_env(**variables_of(rank)),
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in range(2)]
        finished = []
        try:
            for process in processes:
                finished.append(process.communicate(timeout=120))
        finally:
            for process in processes:
                process.kill()
    for process, (out, err) in zip(processes, finished):
        assert process.returncode == 0, f"{out}\n{err[-4000:]}"
    return [out for out, _ in finished]


def test_pytorchjob_and_srun_variables_form_one_job_without_a_launcher(tmp_path):
    port = _free_port_from(29600, 29700)
    config = tmp_path / "fsdp.yaml"  # what `hasten config` / `accelerate config` writes for FSDP
    config.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nmixed_precision: 'no'\n"
                      "gradient_accumulation_steps: 2\nnum_processes: 2\nfsdp_config:\n  fsdp_version: 2\n"
                      "  fsdp_state_dict_type: SHARDED_STATE_DICT\n  fsdp_reshard_after_forward: true\n")
    pytorchjob = lambda rank: {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": 2, "RANK": rank,
                               "HASTEN_CONFIG_FILE": config}
    outputs = _run_pair(pytorchjob, tmp_path / "pytorchjob")
    assert [line.split()[-1] for out in outputs for line in out.splitlines() if "ENGINE OK" in line] == \
        ["0/2", "1/2"], outputs
    assert all("PyTorchJob" in out and " FSDP " in out for out in outputs), outputs

    job_id = _free_port_from(15000 + 4100, 15000 + 4200) - 15000  # SLURM's port: 15000 + the job id's last 4 digits
    srun = lambda rank: {"SLURM_JOB_ID": f"88{job_id:04d}", "SLURM_STEP_ID": 0, "SLURM_PROCID": rank,
                         "SLURM_LOCALID": rank, "SLURM_NODEID": 0, "SLURM_NTASKS": 2, "SLURM_STEP_NUM_TASKS": 2,
                         "SLURM_STEP_NUM_NODES": 1, "SLURM_STEP_NODELIST": "localhost",
                         "SLURM_JOB_NODELIST": "localhost", "SLURM_STEP_TASKS_PER_NODE": 2, "SLURM_TASKS_PER_NODE": 2}
    outputs = _run_pair(srun, tmp_path / "srun")
    assert all("ENGINE OK SLURM (srun) MULTI_CPU" in out for out in outputs), outputs
