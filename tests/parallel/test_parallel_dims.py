"""ParallelDims (the layout of the processes), resolve_parallelism_config, and the launcher / config file that feed them.

Single-process: sizes and ranks are pure arithmetic, checked for every shape of 1, 2, 4 and 8 processes without
building a mesh. The mesh itself is checked on 2 and on 4 real processes (tests/parallel/check_parallel_dims.py).
"""
from __future__ import annotations

import itertools
import math
import os

import pytest

from hasten.commands import cli
from hasten.commands import launch as launch_command
from hasten.commands.errors import CommandError

from launch_fixtures import plan_for, script  # noqa: F401 - pytest fixtures
from hasten.core.env_aliases import ConfigConflictError
from hasten.parallel.config import SIZE_FIELDS, check_size_combination
from hasten.parallel import ParallelDims, ParallelismConfig, launcher_parallel_sizes, resolve_parallelism_config

ORDER = ("dp_replicate", "dp_shard", "cp", "sp", "tp")


@pytest.fixture(autouse=True)
def no_launcher_env(monkeypatch):
    """No parallelism variable of the test runner's own environment leaks into a test."""
    for name in list(os.environ):
        if "PARALLELISM_CONFIG" in name:
            monkeypatch.delenv(name)


def shapes(world: int):
    """Every (dp_replicate, dp_shard, cp, sp, tp) of ``world`` processes that ParallelismConfig accepts."""
    divisors = [d for d in range(1, world + 1) if world % d == 0]
    for shape in itertools.product(divisors, repeat=len(ORDER)):
        sizes = dict(zip(ORDER, shape))
        if math.prod(shape) != world:
            continue
        try:
            check_size_combination(**{f"{name}_size": size for name, size in sizes.items()})
        except ValueError:
            continue
        yield sizes


ALL_SHAPES = [pytest.param(world, sizes, id=f"{world}-" + "-".join(f"{k}{v}" for k, v in sizes.items() if v > 1))
              for world in (1, 2, 4, 8) for sizes in shapes(world)]


# ------------------------------------------------------------------------------------------ sizes and ranks
@pytest.mark.parametrize("world, sizes", ALL_SHAPES)
def test_every_valid_shape_lays_out_every_rank(world, sizes):
    config = ParallelismConfig(**{f"{name}_size": size for name, size in sizes.items()})
    seen = set()
    for rank in range(world):
        dims = ParallelDims.from_config(config, world, rank=rank)
        assert dims.sizes == sizes and dims.world_size == world
        where = dims.coordinates()
        # row-major over dp_replicate, dp_shard, cp, sp, tp: the coordinates give back the rank
        back = 0
        for name in ORDER:
            assert 0 <= where[name] < sizes[name]
            back = back * sizes[name] + where[name]
        assert back == rank
        seen.add(tuple(where.values()))
        assert dims.tp_rank == where["tp"] and dims.cp_rank == where["cp"] and dims.sp_rank == where["sp"]
        assert dims.dp_shard_rank == where["dp_shard"] and dims.dp_replicate_rank == where["dp_replicate"]
        assert dims.dp_rank == where["dp_replicate"] * sizes["dp_shard"] + where["dp_shard"]
        assert dims.dp_size == sizes["dp_replicate"] * sizes["dp_shard"]
        assert (dims.tp_size, dims.cp_size, dims.sp_size) == (sizes["tp"], sizes["cp"], sizes["sp"])
        assert dims.model_parallel == (sizes["tp"] > 1 or sizes["cp"] > 1 or sizes["sp"] > 1)
        assert dims.sharded == (sizes["dp_shard"] > 1)
        assert dims.uses_mesh == (sizes["sp"] == 1 and (sizes["dp_shard"] > 1 or sizes["cp"] > 1 or sizes["tp"] > 1))
        names = tuple(name for name in ("dp_replicate", "dp_shard", "cp", "tp") if sizes[name] > 1)
        assert dims.mesh_dim_names == (names or ("dp_replicate",))
        assert dims.mesh_shape == tuple(sizes[name] for name in dims.mesh_dim_names)
        assert not dims.mesh_built  # nothing above built a mesh
    assert len(seen) == world  # each rank has its own place


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_data_parallel_peers_are_the_ranks_that_share_the_model_coordinates(world):
    for sizes in shapes(world):
        layouts = [ParallelDims(**sizes, world_size=world, rank=rank) for rank in range(world)]
        for dims in layouts:
            peers = [other for other in layouts if all(other.coordinates()[name] == dims.coordinates()[name]
                                                       for name in ("cp", "sp", "tp"))]
            assert sorted(peer.dp_rank for peer in peers) == list(range(dims.dp_size))


def test_flattened_dimensions_join_the_enabled_ones():
    hsdp_cp = ParallelDims(dp_replicate=2, dp_shard=2, cp=2, world_size=8)
    assert hsdp_cp.flattened_dim_names == {"dp": ("dp_replicate", "dp_shard"), "dp_shard_cp": ("dp_shard", "cp"),
                                           "dp_cp": ("dp_replicate", "dp_shard", "cp")}
    assert ParallelDims(tp=2, world_size=2).flattened_dim_names == {}
    assert ParallelDims(dp_shard=2, tp=2, world_size=4).flattened_dim_names == {
        "dp": ("dp_shard",), "dp_shard_cp": ("dp_shard",), "dp_cp": ("dp_shard",)}


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_no_config_and_an_all_ones_config_mean_plain_data_parallelism(world):
    for dims in (ParallelDims.from_config(None, world, rank=world - 1),
                 ParallelDims.from_config(ParallelismConfig(), world, rank=world - 1), ParallelDims(world_size=world)):
        assert dims.sizes == {"dp_replicate": world, "dp_shard": 1, "cp": 1, "sp": 1, "tp": 1}
        assert dims.dp_size == world and not dims.uses_mesh and not dims.model_parallel and not dims.sharded
        assert dims.dp_group is None  # the world group: no mesh, no new group, DDP as before
        assert not dims.mesh_built
    assert ParallelDims.from_config(None, world, rank=world - 1).dp_rank == world - 1


def test_deepspeed_sequence_parallelism_leaves_the_rest_to_data_parallelism():
    dims = ParallelDims.from_config(ParallelismConfig(sp_size=2), 8, rank=5)
    assert dims.sizes == {"dp_replicate": 4, "dp_shard": 1, "cp": 1, "sp": 2, "tp": 1}
    assert (dims.dp_rank, dims.sp_rank, dims.dp_size) == (2, 1, 4)
    assert not dims.uses_mesh and dims.model_parallel and dims.build_mesh("cpu") is None
    with pytest.raises(NotImplementedError, match="DeepSpeed"):
        dims.dp_group
    with pytest.raises(ValueError, match="sp_size=4 = 4 processes does not divide"):
        ParallelDims(sp=4, world_size=6)


# ------------------------------------------------------------------------------------------ invalid shapes
@pytest.mark.parametrize("kwargs, world, message", [
    ({"dp_shard_size": 2, "tp_size": 2}, 2,
     "dp_shard_size=2 x tp_size=2 = 4 processes, but the job has 2 processes (WORLD_SIZE=2)"),
    ({"dp_shard_size": 4}, 8, "dp_shard_size=4 = 4 processes, but the job has 8 processes (WORLD_SIZE=8)"),
    ({"tp_size": 3}, 4, "tp_size=3 = 3 processes, but the job has 4 processes"),
    ({"dp_replicate_size": 2, "dp_shard_size": 2, "tp_size": 2}, 4, "= 8 processes, but the job has 4 processes"),
    ({"cp_size": 2}, 1, "cp_size=2 = 2 processes, but the job has 1 process (WORLD_SIZE=1)"),
    ({"sp_size": 2, "dp_shard_size": 2}, 8, "sp_size=2 = 4 processes, but the job has 8"),
])
def test_a_shape_that_does_not_fit_the_job_names_the_sizes_and_the_process_count(kwargs, world, message):
    with pytest.raises(ValueError) as error:
        ParallelDims.from_config(ParallelismConfig(**kwargs), world)
    assert message in str(error.value) and "does not match the number of processes" in str(error.value)
    assert "Launch" in str(error.value)  # and says how to fix it


@pytest.mark.parametrize("kwargs, message", [
    ({"tp": 0, "world_size": 1}, "tp must be a whole number >= 1, got 0"),
    ({"dp_shard": 2.0, "world_size": 2}, "dp_shard must be a whole number >= 1, got 2.0"),
    ({"world_size": 0}, "world_size must be a whole number >= 1, got 0"),
    ({"cp": 2, "sp": 2, "world_size": 4}, "cp_size=2 and sp_size=2"),
    ({"world_size": 2, "rank": 2}, "rank must be a whole number from 0 to 1, got 2"),
])
def test_bad_sizes_are_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ParallelDims(**kwargs)


def test_a_mesh_of_another_size_than_the_job_is_refused_before_it_is_built(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(ValueError, match="dp_shard_size=2 = 2 processes, but the job has 1 process"):
        ParallelDims(dp_shard=2, world_size=2, rank=0).build_mesh("cpu")


# ------------------------------------------------------------------------------------------ which config
def test_without_explicit_config_or_launcher_switch_there_is_none():
    assert resolve_parallelism_config(None, env={}) is None
    assert resolve_parallelism_config(None, env={"HASTEN_PARALLELISM_CONFIG_TP_SIZE": "2"}) is None
    assert resolve_parallelism_config(None, env={"HASTEN_USE_PARALLELISM_CONFIG": "false"}) is None


@pytest.mark.parametrize("switch", ["HASTEN_USE_PARALLELISM_CONFIG", "ACCELERATE_USE_PARALLELISM_CONFIG"])
@pytest.mark.parametrize("prefix", ["HASTEN_", "ACCELERATE_", ""])
def test_the_launcher_environment_builds_the_config(switch, prefix):
    env = {switch: "true", f"{prefix}PARALLELISM_CONFIG_DP_SHARD_SIZE": "2",
           f"{prefix}PARALLELISM_CONFIG_TP_SIZE": "2"}
    config = resolve_parallelism_config(None, env=env)
    assert (config.dp_replicate_size, config.dp_shard_size, config.tp_size, config.cp_size) == (1, 2, 2, 1)
    assert launcher_parallel_sizes(env) == {"dp_shard_size": (2, f"{prefix or ''}PARALLELISM_CONFIG_DP_SHARD_SIZE"),
                                            "tp_size": (2, f"{prefix}PARALLELISM_CONFIG_TP_SIZE")}


def test_explicit_config_beats_the_environment_when_they_agree():
    explicit = ParallelismConfig(dp_shard_size=2)
    env = {"HASTEN_USE_PARALLELISM_CONFIG": "true", "HASTEN_PARALLELISM_CONFIG_DP_SHARD_SIZE": "2"}
    assert resolve_parallelism_config(explicit, env=env) is explicit
    assert resolve_parallelism_config(explicit, env={}) is explicit


def test_explicit_config_and_environment_that_disagree_is_an_error_naming_both():
    explicit = ParallelismConfig(dp_shard_size=2, tp_size=2)
    env = {"HASTEN_USE_PARALLELISM_CONFIG": "true", "HASTEN_PARALLELISM_CONFIG_DP_SHARD_SIZE": "4",
           "PARALLELISM_CONFIG_TP_SIZE": "2"}
    with pytest.raises(ConfigConflictError) as error:
        resolve_parallelism_config(explicit, env=env)
    text = str(error.value)
    assert "dp_shard_size=2 in the ParallelismConfig given in code" in text
    assert "HASTEN_PARALLELISM_CONFIG_DP_SHARD_SIZE=4" in text and "tp_size" not in text


def test_environment_conflicts_and_bad_values_are_named():
    with pytest.raises(ConfigConflictError, match="HASTEN_PARALLELISM_CONFIG_TP_SIZE='2' but "
                                                  "ACCELERATE_PARALLELISM_CONFIG_TP_SIZE='4'"):
        resolve_parallelism_config(None, env={"HASTEN_USE_PARALLELISM_CONFIG": "1",
                                              "HASTEN_PARALLELISM_CONFIG_TP_SIZE": "2",
                                              "ACCELERATE_PARALLELISM_CONFIG_TP_SIZE": "4"})
    with pytest.raises(ValueError, match="HASTEN_PARALLELISM_CONFIG_CP_SIZE='zero'.*cp_size must be an integer"):
        resolve_parallelism_config(None, env={"HASTEN_USE_PARALLELISM_CONFIG": "1",
                                              "HASTEN_PARALLELISM_CONFIG_CP_SIZE": "zero"})
    with pytest.raises(TypeError, match="must be a ParallelismConfig"):
        resolve_parallelism_config({"tp_size": 2}, env={})


def test_parallelism_config_from_the_real_environment_and_its_mesh_delegation(monkeypatch):
    monkeypatch.setenv("HASTEN_USE_PARALLELISM_CONFIG", "true")
    monkeypatch.setenv("HASTEN_PARALLELISM_CONFIG_DP_SHARD_SIZE", "2")
    config = resolve_parallelism_config(None)
    assert config.dp_shard_size == 2 and ParallelismConfig().dp_shard_size == 2
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(ValueError, match="does not match the number of processes"):
        config.build_device_mesh("cpu")
    assert set(SIZE_FIELDS) == {f"{name}_size" for name in ORDER}


# ------------------------------------------------------------------------------------------ launcher and config file
def parallel_env(plan) -> dict:
    return {key: value for key, value in plan.env.items() if "PARALLELISM_CONFIG" in key}


def test_launcher_flags_become_the_variables_the_script_reads(script):
    plan = plan_for(["--use_parallelism_config", "--parallelism_config_dp_shard_size", "2",
                     "--parallelism-config-tp-size", "2", "--parallelism_config_cp_comm_strategy", "alltoall",
                     "-n", "4", script])
    assert parallel_env(plan) == {"HASTEN_USE_PARALLELISM_CONFIG": "true",
                                  "HASTEN_PARALLELISM_CONFIG_DP_SHARD_SIZE": "2",
                                  "HASTEN_PARALLELISM_CONFIG_TP_SIZE": "2",
                                  "HASTEN_PARALLELISM_CONFIG_CP_COMM_STRATEGY": "alltoall"}
    config = resolve_parallelism_config(None, env=plan.env)
    assert (config.dp_shard_size, config.tp_size) == (2, 2)
    assert ParallelDims.from_config(config, 4).sizes["tp"] == 2
    assert parallel_env(plan_for(["-n", "2", script])) == {}


def test_a_size_flag_implies_the_switch_with_a_note(script):
    plan = plan_for(["--parallelism_config_dp_shard_size", "2", "-n", "2", script])
    assert plan.env["HASTEN_USE_PARALLELISM_CONFIG"] == "true"
    assert any("without --use_parallelism_config" in note for note in plan.notes)


@pytest.mark.parametrize("argv, message", [
    (["--parallelism_config_dp_shard_size", "2", "--parallelism_config_tp_size", "2", "-n", "2"],
     "dp_shard_size=2 x tp_size=2 = 4 processes, but the job has 2 processes"),
    (["--parallelism_config_tp_size", "0", "-n", "2"], "--parallelism_config_tp_size 0: expected an integer >= 1"),
    (["--parallelism_config_cp_size", "2", "--parallelism_config_sp_size", "2", "-n", "4"], "exclude each other"),
    (["--parallelism_config_dp_replicate_size", "2", "--parallelism_config_cp_size", "2", "-n", "4"],
     "pure data-parallel replication"),
    (["--parallelism_config_cp_comm_strategy", "ring", "-n", "1"], "expected one of 'allgather', 'alltoall'"),
    (["--parallelism_config_sp_seq_length_is_variable", "maybe", "-n", "1"], "expected true or false"),
])
def test_bad_launcher_sizes_stop_the_launch_naming_the_values(script, argv, message):
    with pytest.raises(CommandError, match=message.replace("(", r"\(").replace(")", r"\)")):
        plan_for([*argv, script])


def test_the_command_line_reports_bad_sizes_and_launches_nothing(script, monkeypatch, capsys):
    monkeypatch.setattr(launch_command, "execute", lambda plan: pytest.fail("launched"))
    assert cli.main(["launch", "--parallelism_config_tp_size", "4", "-n", "2", script]) == 2
    err = capsys.readouterr().err
    assert "tp_size=4 = 4 processes, but the job has 2 processes (WORLD_SIZE=2)" in err
    assert "--parallelism_config_tp_size" in err


def test_config_file_section_becomes_the_variables(script, tmp_path):
    from hasten.config.config_file import load_config_file

    path = tmp_path / "cfg.yaml"
    path.write_text("distributed_type: MULTI_CPU\nnum_processes: 4\nparallelism_config:\n"
                    "  parallelism_config_dp_replicate_size: 2\n  parallelism_config_dp_shard_size: 2\n"
                    "  parallelism_config_tp_size: 1\n  cp_size: 1\n")
    config = load_config_file(path)
    assert config["parallelism_config"] == {"parallelism_config_dp_replicate_size": 2,
                                            "parallelism_config_dp_shard_size": 2, "parallelism_config_tp_size": 1,
                                            "parallelism_config_cp_size": 1}
    plan = plan_for([script], config, str(path))
    assert parallel_env(plan) == {"HASTEN_USE_PARALLELISM_CONFIG": "true",
                                  "HASTEN_PARALLELISM_CONFIG_DP_REPLICATE_SIZE": "2",
                                  "HASTEN_PARALLELISM_CONFIG_DP_SHARD_SIZE": "2",
                                  "HASTEN_PARALLELISM_CONFIG_TP_SIZE": "1", "HASTEN_PARALLELISM_CONFIG_CP_SIZE": "1"}
    dims = ParallelDims.from_config(resolve_parallelism_config(None, env=plan.env), 4)
    assert (dims.dp_replicate, dims.dp_shard) == (2, 2)
    # a flag beats the file, with a note; the sizes are checked against the flag's values
    plan = plan_for(["--parallelism_config_dp_shard_size", "4", "--parallelism_config_dp_replicate_size", "1",
                     "-n", "4", script], config, str(path))
    assert plan.env["HASTEN_PARALLELISM_CONFIG_DP_SHARD_SIZE"] == "4"
    assert any("--parallelism_config_dp_shard_size 4 overrides parallelism_config_dp_shard_size: 2" in note
               for note in plan.notes)
    with pytest.raises(CommandError, match=r"dp_shard_size=2 \(config file\)"):
        plan_for(["-n", "2", script], config, str(path))
    assert parallel_env(plan_for([script], {"parallelism_config": {}}, str(path))) == {}


@pytest.mark.parametrize("section, message", [
    ("  parallelism_config_tp_sizes: 2\n", "unknown key 'parallelism_config_tp_sizes' "
                                           "(did you mean 'parallelism_config_tp_size'?)"),
    ("  parallelism_config_dp_shard_size: 0\n", "parallelism_config_dp_shard_size: expected an integer >= 1, got 0"),
    ("  parallelism_config_cp_backend: ring\n", "expected one of 'torch'"),
    ("  tp_size: 2\n  parallelism_config_tp_size: 2\n", "given twice"),
])
def test_bad_config_file_sections_name_the_key(tmp_path, section, message):
    from hasten.config.config_file import load_config_file

    path = tmp_path / "cfg.yaml"
    path.write_text("parallelism_config:\n" + section)
    with pytest.raises(ValueError) as error:
        load_config_file(path)
    assert str(path) in str(error.value) and "'parallelism_config'" in str(error.value)
    assert message in str(error.value)


def test_accelerate_config_file_section_is_read_as_is(tmp_path):
    """The section Accelerate's `accelerate config` writes (keys with their prefix) loads unchanged."""
    pytest.importorskip("accelerate")
    from accelerate.commands.config.config_args import ClusterConfig

    from hasten.config.config_file import load_config_file

    theirs = {"parallelism_config_dp_replicate_size": 1, "parallelism_config_dp_shard_size": 2,
              "parallelism_config_tp_size": 2, "parallelism_config_cp_size": 1,
              "parallelism_config_cp_comm_strategy": "allgather"}
    path = tmp_path / "accelerate.yaml"
    ClusterConfig(compute_environment="LOCAL_MACHINE", distributed_type="MULTI_CPU", mixed_precision="no",
                  use_cpu=True, debug=False, num_processes=4, parallelism_config=theirs).to_yaml_file(path)
    assert load_config_file(path)["parallelism_config"] == theirs


# ------------------------------------------------------------------------------------------ real processes
@pytest.mark.parametrize("world", [2, 4])
def test_meshes_ranks_and_dp_groups_on_real_processes(world):
    from helpers import run_launch

    result = run_launch("check_parallel_dims.py", num_processes=world)
    count = sum(1 for _ in shapes(world) if _["sp"] == 1)
    assert f"PARALLEL DIMS CHECKS PASSED world={world} shapes={count}" in result.stdout


def test_build_device_mesh_leaves_the_world_to_torch_when_no_process_group_exists(monkeypatch):
    """No process group and no launcher (a test with torch's init_device_mesh replaced, a tool planning a layout):
    the mesh of the config's sizes is asked of torch, which decides about the world; the flattened dimensions are
    built from lists of names."""
    import torch.distributed.device_mesh as device_mesh
    from hasten.parallel import ParallelismConfig

    built = {}

    class FakeMesh:
        def __init__(self, shape, names):
            self.shape, self.mesh_dim_names, self.flattened = shape, names, []

        def __getitem__(self, names):
            mesh = self

            class Sub:
                def _flatten(self, name):
                    mesh.flattened.append((names, name))
                    return name
            return Sub()

    def fake_init(device_type, mesh_shape, mesh_dim_names):
        built["mesh"] = FakeMesh(tuple(mesh_shape), tuple(mesh_dim_names))
        return built["mesh"]

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr(device_mesh, "init_device_mesh", fake_init)
    mesh = ParallelismConfig(dp_replicate_size=2, dp_shard_size=2, tp_size=2).build_device_mesh("cpu")
    assert mesh.shape == (2, 2, 2) and mesh.mesh_dim_names == ("dp_replicate", "dp_shard", "tp")
    assert (["dp_replicate", "dp_shard"], "dp") in mesh.flattened


def test_an_unknown_cp_comm_strategy_keeps_the_references_phrase():
    from hasten.parallel.config import TorchContextParallelConfig

    with pytest.raises(ValueError, match="Invalid cp_comm_strategy: invalid"):
        TorchContextParallelConfig(cp_comm_strategy="invalid")


def test_a_handler_for_a_dimension_of_size_1_is_named_in_a_warning():
    from hasten import Accelerator
    from hasten.state import AcceleratorState
    from hasten.utils import TorchTensorParallelConfig

    config = ParallelismConfig(tp_handler=TorchTensorParallelConfig())
    assert config.ignored_handlers() == ["tp"] and ParallelismConfig(tp_size=2).ignored_handlers() == []
    AcceleratorState._reset_state(True)
    try:
        with pytest.warns(UserWarning, match="tp_handler is set but tp_size is 1, so it is ignored"):
            Accelerator(cpu=True, parallelism_config=config)
    finally:
        AcceleratorState._reset_state(True)


def test_fsdp_shards_over_dp_shard_cp_or_dp_shard_replicating_across_dp_replicate():
    class Named:  # what fsdp_mesh_of reads of a DeviceMesh: its dimension names and slicing by them
        def __init__(self, *names):
            self.mesh_dim_names = names

        def __getitem__(self, names):
            return names

    assert ParallelDims.fsdp_mesh_of(None) is None
    assert ParallelDims.fsdp_mesh_of(Named("dp_replicate", "dp_shard", "dp_shard_cp")) == ("dp_replicate",
                                                                                            "dp_shard_cp")
    assert ParallelDims.fsdp_mesh_of(Named("dp_shard", "tp")) == "dp_shard"
    rows = Named("rows")
    assert ParallelDims.fsdp_mesh_of(rows) is rows  # names it does not know: every process of the mesh
