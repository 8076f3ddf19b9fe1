"""The engines' variables (core/cluster.py): each engine's place read from exactly the variables it sets, the order
between engines, and a clear error naming the variable for every value that cannot be right."""
from __future__ import annotations

import pytest

from hasten.core.cluster import adopt_placement, check_rendezvous, place_process, slurm_tasks_on_node

#: what Kubeflow's PyTorchJob operator sets in the pod of worker 2 of 4 (one process per pod)
PYTORCHJOB = {"MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "4", "RANK": "2",
              "PYTHONUNBUFFERED": "1", "KUBERNETES_SERVICE_HOST": "10.0.0.1"}
#: what srun sets in task 3 of `srun -N 2 --ntasks-per-node 2` (job 7123456), no launcher in between
SRUN = {"SLURM_JOB_ID": "7123456", "SLURM_STEP_ID": "0", "SLURM_PROCID": "3", "SLURM_LOCALID": "1",
        "SLURM_NODEID": "1", "SLURM_NTASKS": "4", "SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_NUM_NODES": "2",
        "SLURM_STEP_NODELIST": "gpu[07-08]", "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
        "SLURM_TASKS_PER_NODE": "2(x2)"}


def test_each_engine_is_read_from_its_own_variables():
    assert place_process({**PYTORCHJOB, "PET_NPROC_PER_NODE": "2", "LOCAL_RANK": "1"}).local_rank == 1  # torchrun
    place = place_process(PYTORCHJOB)
    assert (place.rank, place.world_size, place.local_rank, place.main_address, place.main_port) == \
        (2, 4, 0, "job-master-0", 23456)
    place = place_process(SRUN)
    assert place.engine == "SLURM (srun)"
    assert (place.rank, place.world_size, place.local_rank, place.local_world_size) == (3, 4, 1, 2)
    assert (place.main_address, place.main_port) == ("gpu07", 15000 + 3456)  # the job id's last four digits
    assert place_process({**SRUN, "MASTER_PORT": "29400"}).main_port == 29400
    place = place_process({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                           "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1234"})
    assert (place.engine, place.rank, place.local_world_size) == ("Open MPI", 1, 2)
    assert place_process({"PMI_RANK": "0", "PMI_SIZE": "3"}).world_size == 3
    assert place_process({}) is None


def test_lsf_jsrun_is_read_before_the_mpi_variables_beside_it(tmp_path):
    """jsrun's task 5 of 8 in LSF job 4417 on two nodes, with the Spectrum MPI variables jsrun also sets; the rank
    file lists the launch node first, then one line per slot of each compute node."""
    rankfile = tmp_path / "rankfile"
    rankfile.write_text("batch1\n" + "c01\n" * 4 + "c02\n" * 4)
    jsrun = {"LSB_JOBID": "4417", "LSB_DJOB_RANKFILE": str(rankfile), "JSM_NAMESPACE_RANK": "5",
             "JSM_NAMESPACE_SIZE": "8", "JSM_NAMESPACE_LOCAL_RANK": "1", "OMPI_COMM_WORLD_RANK": "5",
             "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}
    place = place_process(jsrun)
    assert (place.engine, place.rank, place.world_size, place.local_rank) == ("IBM LSF (jsrun)", 5, 8, 1)
    assert (place.main_address, place.main_port) == ("c01", 10000 + 4417)
    assert place.sources["main_address"] == "LSB_DJOB_RANKFILE" and place.sources["main_port"] == "LSB_JOBID"
    assert place_process({**jsrun, "MASTER_ADDR": "given"}).main_address == "given"
    with pytest.raises(ValueError, match="LSB_DJOB_RANKFILE"):
        place_process({**jsrun, "LSB_DJOB_RANKFILE": str(tmp_path / "missing")})


def test_torch_variables_win_and_a_batch_script_is_not_a_task():
    # torchrun (hasten launch) inside an srun step: its own variables name the worker
    torchrun = {**SRUN, "RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "gpu07", "MASTER_PORT": "1"}
    assert place_process(torchrun).rank == 5
    # the sbatch script itself: SLURM_PROCID=0 of SLURM_NTASKS=4, but not one of a step's tasks; its own step
    # (if the variables are there) has one task
    batch = {key: value for key, value in SRUN.items() if not key.startswith("SLURM_STEP")}
    assert place_process({**batch, "SLURM_PROCID": "0"}) is None
    assert place_process({**batch, "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "1"}).world_size == 1
    assert slurm_tasks_on_node("2(x3),1", 3) == 1 and slurm_tasks_on_node("4", 1) is None


@pytest.mark.parametrize("variables, words", [
    ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2 is not below WORLD_SIZE=2"),
    ({"RANK": "one", "WORLD_SIZE": "2"}, "RANK='one'"),
    ({"RANK": "-1", "WORLD_SIZE": "2"}, "RANK='-1'"),
    ({"WORLD_SIZE": "2"}, "RANK is not"),
    ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE='0'"),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"}, "LOCAL_RANK=2 is not below"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "70000"}, "not a port"),
    ({**SRUN, "SLURM_PROCID": "4"}, "SLURM_PROCID=4 is not below SLURM_STEP_NUM_TASKS=4"),
    ({**SRUN, "SLURM_STEP_TASKS_PER_NODE": "1(x4)"}, "SLURM_LOCALID=1 is not below"),
    ({**PYTORCHJOB, "WORLD_SIZE": "8", "PET_NPROC_PER_NODE": "2"}, "not started by torchrun"),
])
def test_a_wrong_variable_is_a_clear_error(variables, words):
    with pytest.raises(ValueError, match=words):
        place_process(variables)


def test_a_job_without_an_address_or_port_is_refused_before_any_group():
    with pytest.raises(ValueError, match="MASTER_ADDR is not"):
        check_rendezvous(place_process({"RANK": "0", "WORLD_SIZE": "2"}))
    with pytest.raises(ValueError, match="MASTER_PORT is not"):
        check_rendezvous(place_process({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h"}))
    check_rendezvous(place_process({"RANK": "0", "WORLD_SIZE": "1"}))  # one process needs neither


def test_adopting_writes_torch_names_where_missing():
    environ = dict(SRUN, MASTER_ADDR="given")
    adopt_placement(environ)
    assert {key: environ[key] for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                                          "MASTER_PORT")} == {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1",
                                                              "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "given",
                                                              "MASTER_PORT": "18456"}
