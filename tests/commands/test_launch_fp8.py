"""``hasten launch``'s fp8 options: torchao's reach the script as HASTEN_FP8_*, from flags or a config file's
``fp8_config``; another library's backend or recipe options stop the launch before anything starts."""
import argparse

import pytest

from hasten.commands.cli import main as cli_main
from hasten.commands.errors import CommandError
from hasten.commands.launch import load_launch_config
from hasten.core.planned import NotYetSupportedError
from hasten.utils.launch import setup_fp8_env

from helpers import run_real_launch
from launch_fixtures import no_launch, plan_for, script  # noqa: F401 - fixtures


def _config(tmp_path, fp8_config: str, name="config.yaml"):
    path = tmp_path / name
    path.write_text("distributed_type: 'NO'\nnum_processes: 1\nmixed_precision: fp8\nfp8_config:\n" + fp8_config)
    return load_launch_config(str(path))


def _fp8_env(plan) -> dict:
    return {key: value for key, value in plan.env.items() if key.startswith("HASTEN_FP8_")}


def test_torchao_options_from_flags_and_from_the_config_file(tmp_path, script):
    plan = plan_for(["--mixed_precision", "fp8", "--fp8_backend", "ao", "--fp8_pad_inner_dim", "false", script])
    assert plan.env["HASTEN_MIXED_PRECISION"] == "fp8"
    assert _fp8_env(plan) == {"HASTEN_FP8_BACKEND": "AO", "HASTEN_FP8_PAD_INNER_DIM": "false"}
    path, config = _config(tmp_path, "  backend: AO\n  fp8_enable_fsdp_float8_all_gather: false\n")
    from_file = plan_for(["--config_file", path, script], config, path)
    assert _fp8_env(from_file) == {"HASTEN_FP8_BACKEND": "AO", "HASTEN_FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER": "false"}
    typed = plan_for(["--config_file", path, "--fp8_enable_fsdp_float8_all_gather", "true", script], config, path)
    assert typed.env["HASTEN_FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER"] == "true"  # the flag wins over the file
    assert _fp8_env(plan_for(["--mixed_precision", "fp8", script])) == {}  # the parser's defaults are no options


@pytest.mark.parametrize("backend, library", [("te", "TransformerEngine"), ("msamp", "MS-AMP")])
def test_another_librarys_backend_stops_the_launch(tmp_path, script, no_launch, backend, library):
    with pytest.raises(NotYetSupportedError, match=f"fp8 training with {library}.*torchao"):
        plan_for(["--mixed_precision", "fp8", "--fp8_backend", backend, script])
    path, config = _config(tmp_path, f"  backend: {backend.upper()}\n")
    with pytest.raises(NotYetSupportedError, match=library):
        plan_for(["--config_file", path, script], config, path)
    assert cli_main(["launch", "--config_file", path, script]) == 2  # hasten launch: an error, nothing started


def test_recipe_options_and_unknown_backends(tmp_path, script):
    with pytest.raises(NotYetSupportedError, match=r"fp8 recipe options \(--fp8_format, --fp8_margin\)"):
        plan_for(["--mixed_precision", "fp8", "--fp8_margin", "2", "--fp8_format", "E4M3", script])
    path, config = _config(tmp_path, "  backend: FP4\n")
    with pytest.raises(CommandError, match="fp8 backend 'FP4'.*ao, te, msamp"):
        plan_for(["--config_file", path, script], config, path)
    path, config = _config(tmp_path, "  amax_history_len: 16\n", "other.yaml")
    with pytest.raises(NotYetSupportedError, match="--fp8_amax_history_len"):
        plan_for(["--config_file", path, script], config, path)


def test_the_reference_s_helper_sets_the_same_variables():
    env = setup_fp8_env(argparse.Namespace(fp8_backend="ao", fp8_pad_inner_dim="False"), {"A": "1"})
    assert env == {"A": "1", "HASTEN_FP8_BACKEND": "AO", "HASTEN_FP8_PAD_INNER_DIM": "False"}


def test_a_launched_fp8_run_reads_the_config_files_options(tmp_path):
    path, _ = _config(tmp_path, "  backend: AO\n  pad_inner_dim: false\n")
    result = run_real_launch("check_fp8_launch.py", num_processes=None, launch_args=["--config_file", path])
    assert "fp8 launch ok False" in result.stdout
