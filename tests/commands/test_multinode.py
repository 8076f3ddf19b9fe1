"""Multi-machine launches without hand-written ranks: the SLURM layout, node lists, and elastic MIN:MAX jobs."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import yaml

from helpers import ROOT, one_multiprocess_job_at_a_time, clean_env
from hasten.commands.errors import CommandError
from hasten.commands.launch_plan import build_plan
from hasten.core.slurm import expand_nodelist, first_host, slurm_layout
from hasten.commands.launch import launch_command_parser, load_launch_config

SLURM_2_NODES = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": "1",
                 "SLURM_JOB_NODELIST": "gpu[07-08]"}


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("print('hello')\n")
    return str(path)


def plan_for(argv, environ, config=None, config_path=None, accelerators=0, hostnames=lambda nodelist: None):
    """The plan on a made-up machine inside ``environ`` (no scontrol unless ``hostnames`` answers)."""
    args = launch_command_parser().parse_args(argv)
    return build_plan(args, config, config_path, environ=environ, cpu_count=8,
                      count_accelerators=lambda: accelerators, find_free_port=lambda: 41234,
                      is_port_in_use=lambda port, host: False, slurm_hostnames=hostnames)


def torchrun_view(plan):
    from torch.distributed import run as torchrun

    return torchrun.parse_args(plan.torchrun_args)


# ------------------------------------------------------------------------------------------ node lists
@pytest.mark.parametrize("nodelist, hosts", [
    ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
    ("gpu5", ["gpu5"]),
    ("a1,b[2-3],c", ["a1", "b2", "b3", "c"]),
    ("n[8-11]", ["n8", "n9", "n10", "n11"]),
    ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
    ("node[001-002]-ib,login", ["node001-ib", "node002-ib", "login"]),
])
def test_compact_node_lists_are_expanded(nodelist, hosts):
    assert expand_nodelist(nodelist) == hosts


@pytest.mark.parametrize("nodelist, message", [
    ("node[01-", "unbalanced"), ("node[3-1]", "backwards"), ("node[a-b]", "not a number"), ("", "no host"),
])
def test_bad_node_lists_are_explained(nodelist, message):
    with pytest.raises(ValueError, match=message):
        expand_nodelist(nodelist)


def test_first_host_asks_scontrol_when_it_is_there(tmp_path, monkeypatch):
    assert first_host("node[03-04]", hostnames=lambda nodelist: None) == "node03"  # no scontrol: parsed here
    assert first_host("node[03-04]", hostnames=lambda nodelist: ["n3.cluster", "n4.cluster"]) == "n3.cluster"
    fake = tmp_path / "scontrol"
    fake.write_text("#!/bin/sh\n[ \"$1 $2\" = 'show hostnames' ] && printf 'from-scontrol-%s\\nother\\n' \"$3\"\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert first_host("node[01-02]") == "from-scontrol-node[01-02]"
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert first_host("node[01-02]") == "node01"


# ------------------------------------------------------------------------------------------ the SLURM layout
def test_no_layout_outside_slurm():
    assert slurm_layout({}) is None
    assert slurm_layout({"SLURM_JOB_ID": "1"}) is None  # no node count or node list: not an allocation to read


def test_a_job_step_counts_its_own_nodes():
    layout = slurm_layout({**SLURM_2_NODES, "SLURM_JOB_NUM_NODES": "4", "SLURM_JOB_NODELIST": "gpu[05-08]",
                           "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NODELIST": "gpu[07-08]"})
    assert (layout.num_machines, layout.machine_rank, layout.nodelist) == (2, 1, "gpu[07-08]")
    assert layout.num_machines_from == "SLURM_STEP_NUM_NODES" and layout.job_id == "4242"
    assert slurm_layout({"SLURM_NNODES": "3", "SLURM_NODELIST": "a[1-3]"}).num_machines == 3


def test_inconsistent_slurm_variables_are_errors():
    with pytest.raises(ValueError, match="SLURM_NODEID=2 is not below SLURM_JOB_NUM_NODES=2"):
        slurm_layout({**SLURM_2_NODES, "SLURM_NODEID": "2"})
    with pytest.raises(ValueError, match="srun --ntasks-per-node=1"):
        slurm_layout({**SLURM_2_NODES, "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "16"})


def test_the_layout_comes_from_the_allocation(script):
    plan = plan_for(["-n", "8", script], SLURM_2_NODES)
    parsed = torchrun_view(plan)
    assert (parsed.nnodes, parsed.nproc_per_node, parsed.node_rank) == ("2", "4", 1)
    assert (parsed.master_addr, parsed.master_port) == ("gpu07", 29500)
    assert plan.sources["num_machines"] == plan.sources["machine_rank"] == plan.sources["main_process_ip"] == "SLURM"
    assert any("SLURM job 4242: this is machine 1 of 2; machine 0 is gpu07" in note for note in plan.notes)
    scontrol = plan_for(["-n", "8", script], SLURM_2_NODES, hostnames=lambda nodelist: ["gpu07.ib"])
    assert torchrun_view(scontrol).master_addr == "gpu07.ib"


def test_one_process_per_accelerator_on_every_machine_by_default(script):
    plan = plan_for([script], SLURM_2_NODES, accelerators=4)
    assert plan.settings["num_processes"] == 8 and torchrun_view(plan).nproc_per_node == "4"


def test_explicit_flags_that_agree_or_name_the_address_win(script):
    plan = plan_for(["-n", "8", "--num_machines", "2", "--machine_rank", "1", "--main_process_ip", "10.0.0.7",
                     script], SLURM_2_NODES)
    parsed = torchrun_view(plan)
    assert (parsed.nnodes, parsed.node_rank, parsed.master_addr) == ("2", 1, "10.0.0.7")


@pytest.mark.parametrize("flags, named", [
    (["--num_machines", "4"], ["--num_machines 4", "SLURM_JOB_NUM_NODES=2"]),
    (["--machine_rank", "0"], ["--machine_rank 0", "SLURM_NODEID=1"]),
    (["--num_machines", "3:4"], ["--num_machines 3:4", "SLURM_JOB_NUM_NODES=2"]),
])
def test_a_flag_that_contradicts_the_allocation_is_an_error_naming_both(script, flags, named):
    with pytest.raises(CommandError) as error:
        plan_for(["-n", "8", *flags, script], SLURM_2_NODES)
    assert all(part in str(error.value) for part in named), str(error.value)


def test_the_allocation_overrides_the_config_file_and_says_so(script, tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump({"num_machines": 1, "machine_rank": 0, "main_process_ip": "old-host",
                                    "num_processes": 8}))
    config_path, config = load_launch_config(str(path))
    plan = plan_for([script], SLURM_2_NODES, config, config_path)
    parsed = torchrun_view(plan)
    assert (parsed.nnodes, parsed.node_rank, parsed.master_addr) == ("2", 1, "gpu07")
    notes = "\n".join(plan.notes)
    assert "SLURM_JOB_NUM_NODES=2 (SLURM job 4242) overrides num_machines: 1" in notes
    assert "SLURM_NODEID=1 (SLURM job 4242) overrides machine_rank: 0" in notes
    assert "overrides main_process_ip: old-host" in notes


def test_a_one_node_allocation_changes_nothing(script):
    one = {"SLURM_JOB_ID": "9", "SLURM_JOB_NUM_NODES": "1", "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "cpu3"}
    plan = plan_for(["-n", "2", script], one)
    parsed = torchrun_view(plan)
    assert (parsed.nnodes, parsed.master_addr, parsed.master_port) == ("1", "127.0.0.1", 41234) and not plan.notes


def test_a_c10d_rendezvous_inside_slurm_is_named_after_the_job(script):
    parsed = torchrun_view(plan_for(["-n", "4", "--rdzv_backend", "c10d", script], SLURM_2_NODES))
    assert parsed.rdzv_endpoint == "gpu07:29500" and parsed.rdzv_id == "slurm-4242"


# ------------------------------------------------------------------------------------------ elastic jobs
def test_a_machine_range_is_an_elastic_c10d_job(script):
    for flag in ("--num_machines", "--nnodes", "--num-machines"):
        plan = plan_for(["-n", "4", flag, "1:2", "--main_process_ip", "node0", script], {})
        parsed = torchrun_view(plan)
        assert (parsed.nnodes, parsed.nproc_per_node, parsed.rdzv_backend) == ("1:2", "2", "c10d")
        assert parsed.rdzv_endpoint == "node0:29500"
        assert any("c10d" in note for note in plan.notes)
    inside = torchrun_view(plan_for(["-n", "6", "--num_machines", "1:3", script], SLURM_2_NODES))
    assert inside.nnodes == "1:3" and inside.rdzv_endpoint == "gpu07:29500"


@pytest.mark.parametrize("argv, message", [
    (["--num_machines", "2:1"], "MIN <= MAX"),
    (["--num_machines", "a:b"], "MIN:MAX"),
    (["--num_machines", "0"], "at least 1"),
    (["--num_machines", "1:2", "--rdzv_backend", "static", "--main_process_ip", "h"], "--rdzv_backend c10d"),
    (["-n", "3", "--num_machines", "1:2", "--main_process_ip", "h"], "divisible by --num_machines 2"),
    (["--num_machines", "1:2"], "needs --main_process_ip"),
])
def test_bad_machine_ranges_are_explained(script, argv, message):
    with pytest.raises(CommandError, match=message):
        plan_for([*argv, script], {})


def test_a_real_elastic_job_of_two_agents_on_this_machine(tmp_path):
    """`--num_machines 1:2 -n 2` started twice here: the c10d rendezvous admits both, 2 processes in all."""
    from hasten.core.network import find_free_port

    script = tmp_path / "ranks.py"
    script.write_text(textwrap.dedent("""
        import os
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        total = torch.tensor([dist.get_rank() + 1])
        dist.all_reduce(total)
        print(f"rank={dist.get_rank()} world={dist.get_world_size()} machine={os.environ['GROUP_RANK']} "
              f"sum={total.item()}", flush=True)
        dist.destroy_process_group()
    """))
    env = {k: v for k, v in clean_env(HASTEN_CONFIG_HOME=str(tmp_path / "none")).items()
           if not k.startswith("SLURM_")}
    port = find_free_port()
    command = [sys.executable, "-m", "hasten", "launch", "--num_machines", "1:2", "-n", "2", "--main_process_ip",
               "127.0.0.1", "--main_process_port", str(port), "--monitor_interval", "0.2", str(script)]
    with one_multiprocess_job_at_a_time():
        agents = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                   cwd=ROOT) for _ in range(2)]
        outputs = [agent.communicate(timeout=180) for agent in agents]
    for agent, (out, err) in zip(agents, outputs):
        assert agent.returncode == 0, f"--- stdout\n{out}\n--- stderr\n{err}"
        assert "elastic --num_machines MIN:MAX uses the c10d rendezvous" in err
    lines = sorted(line for out, _ in outputs for line in out.splitlines() if line.startswith("rank="))
    assert lines == ["rank=0 world=2 machine=0 sum=3", "rank=1 world=2 machine=1 sum=3"], outputs
