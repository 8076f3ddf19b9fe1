"""`hasten launch` takes every `accelerate launch` flag: both spellings, shown once in --help; flags of backends
hasten does not have yet stop the launch before anything starts."""
from __future__ import annotations

import re

import pytest

from hasten.commands import cli
from hasten.commands import launch as launch_command
from hasten.config.launch_groups import BACKEND_GROUPS
from hasten.commands.launch_plan import build_plan
from hasten.commands.launch import launch_command_parser
from hasten.core.planned import NotYetSupportedError

from launch_fixtures import no_launch, script  # noqa: F401 - pytest fixtures


def plan_for(argv):
    args = launch_command_parser().parse_args(argv)
    return build_plan(args, environ={}, cpu_count=8, count_accelerators=lambda: 0, find_free_port=lambda: 41234,
                      is_port_in_use=lambda port, host: False)


def _options(parser) -> dict:
    """``{option string: dest}`` of a parser."""
    return {option: action.dest for action in parser._actions for option in action.option_strings}


def _sample(action) -> list:
    """A value ``action`` accepts on the command line (none for switches)."""
    if action.nargs == 0:
        return []
    if action.choices:
        return [str(list(action.choices)[0])]
    return {int: ["1"], float: ["1.0"]}.get(action.type, ["x"])


# ------------------------------------------------------------------------------------------ Accelerate's flags
def test_every_accelerate_launch_flag_is_accepted_with_the_same_destination():
    accelerate_launch = pytest.importorskip("accelerate.commands.launch")
    theirs = _options(accelerate_launch.launch_command_parser())
    ours = _options(launch_command_parser())
    missing = sorted(option for option in theirs if option not in ours)
    assert not missing, f"flags of `accelerate launch` that `hasten launch` rejects: {missing}"
    moved = sorted(f"{option}: {theirs[option]} -> {ours[option]}" for option in theirs
                   if ours[option] != theirs[option])
    assert not moved, f"flags stored under another name than Accelerate's: {moved}"
    dashed = sorted(option for option in theirs if option.startswith("--") and "_" in option
                    and option.replace("_", "-") not in ours)
    assert not dashed, dashed


def test_every_accelerate_flag_parses_in_both_spellings(script):
    accelerate_launch = pytest.importorskip("accelerate.commands.launch")
    parser = launch_command_parser()
    for action in accelerate_launch.launch_command_parser()._actions:
        if not action.option_strings or action.dest == "help":
            continue
        for option in {action.option_strings[-1], action.option_strings[0].replace("_", "-")}:
            if option.startswith("--") or option in action.option_strings:
                args = parser.parse_args([option, *_sample(action), script])
                assert getattr(args, action.dest) is not None, option


def test_help_shows_each_flag_once_under_its_underscore_spelling(capsys):
    assert cli.main(["launch", "--help"]) == 0
    out = capsys.readouterr().out
    invocations = re.findall(r"^  (-.*?)(?:  |$)", out, re.M)  # the option column of the help
    shown = [flag for line in invocations for flag in re.findall(r"(?<![\w-])(--?[\w-]+)", line)]
    assert len(shown) == len(set(shown)), "a flag is listed twice"
    for action in launch_command_parser()._actions:
        for option in action.option_strings:
            twin = "--" + option[2:].replace("-", "_")
            if option.startswith("--") and twin != option and twin in action.option_strings:
                assert option not in shown, f"{option} (the dashed twin of {twin}) is shown"
            else:
                assert option in shown, f"{option} is not shown"


def test_accepted_flags_without_an_effect_and_torchrun_passthrough(script):
    plan = plan_for(["-q", "--quiet", "--same_network", "--same-network", "--multi_gpu", "-n", "2", "--role",
                     "trainer", script])
    from torch.distributed import run as torchrun

    parsed = torchrun.parse_args(plan.torchrun_args)
    assert parsed.role == "trainer" and parsed.nproc_per_node == "2"


def test_equals_forms_parse(script):
    args = launch_command_parser().parse_args(["--num-processes=3", "--mixed_precision=bf16", "--nnodes=1", script])
    assert (args.num_processes, args.mixed_precision, args.num_machines) == (3, "bf16", "1")


# ------------------------------------------------------------------------------------------ backends not there yet
def _backend_cases(ready: bool = False):
    for group in BACKEND_GROUPS:
        if group.ready != ready or group.own_env:  # own_env groups (DeepSpeed) have their own tests
            continue
        for option in group.options:
            yield pytest.param(group, option, id=f"--{option.name}")


@pytest.mark.parametrize("group, option", list(_backend_cases()))
def test_each_backend_flag_is_not_yet_supported_before_anything_starts(script, group, option):
    parser = launch_command_parser()
    action = next(action for action in parser._actions if f"--{option.name}" in action.option_strings)
    argv = [f"--{option.name}", *_sample(action), script]
    with pytest.raises(NotYetSupportedError) as error:
        plan_for(argv)
    message = str(error.value)
    assert group.feature in message and f"--{option.name}" in message and "not yet supported" in message


@pytest.mark.parametrize("group, option", list(_backend_cases(ready=True)))
def test_each_flag_of_a_built_backend_reaches_its_plugin(script, group, option):
    parser = launch_command_parser()
    action = next(action for action in parser._actions if f"--{option.name}" in action.option_strings)
    sample = _sample(action)
    env = plan_for([f"--{option.name}", *sample, script]).env
    setting = option.name if option.name.startswith(("use_", group.env_prefix)) else group.env_prefix + option.name
    setting = {"fsdp_transformer_layer_cls_to_wrap": "fsdp_transformer_cls_to_wrap"}.get(setting, setting)
    variable = "HASTEN_" + setting.upper()
    assert variable in env, sorted(env)
    assert env[variable] == (sample[0] if sample else "true")


def test_the_command_line_reports_a_backend_flag_and_launches_nothing(script, no_launch, capsys):
    assert cli.main(["launch", "--main_training_function", "main", script]) == 2
    assert "TPUs" in capsys.readouterr().err
    assert cli.main(["launch", "--aws_access_key_id", "key", script]) == 2
    assert "SageMaker" in capsys.readouterr().err


def test_backend_flags_are_checked_before_the_other_settings_and_the_script(tmp_path, no_launch, capsys):
    assert cli.main(["launch", "--aws_access_key_id", "x", "--mixed_precision", "fp7", str(tmp_path / "missing.py")]) == 2
    assert "Amazon SageMaker (--aws_access_key_id) is not yet supported" in capsys.readouterr().err


def test_accelerate_launcher_names_route_to_hasten(script, monkeypatch):
    ran = []
    monkeypatch.setattr(launch_command, "execute", lambda plan: ran.append(plan) or 0)
    args = launch_command_parser().parse_args(["-n", "1", script])
    assert launch_command.launch_command(args) is None and launch_command.simple_launcher(args) is None
    assert launch_command.multi_gpu_launcher(args) is None and len(ran) == 3
    assert launch_command.deepspeed_launcher(args) is None and ran[-1].env["HASTEN_USE_DEEPSPEED"] == "true"
    for name in ("tpu_launcher", "tpu_pod_launcher"):
        with pytest.raises(NotYetSupportedError):
            getattr(launch_command, name)(args)
    with pytest.raises(NotYetSupportedError, match="SageMaker"):
        launch_command.sagemaker_launcher(None, args)
    assert launch_command.clean_option("--num-processes") == "num_processes"
    assert launch_command.clean_option("--fp8-backend=te") == "fp8_backend" and launch_command.clean_option("x") is None
    assert launch_command.options_to_group["use_fsdp"] == "FSDP"


def test_ready_backends_flags_reach_the_plugin_variables(script):
    """A ready group's flags become the HASTEN_* variables its plugin reads."""
    plan = plan_for(["--use_fsdp", "--fsdp_version", "2", "--fsdp_offload_params", "true",
                     "--megatron_lm_tp_degree", "2", "-n", "2", script])
    assert {key: value for key, value in plan.env.items() if key.startswith("HASTEN_")} == {
        "HASTEN_USE_FSDP": "true", "HASTEN_FSDP_VERSION": "2", "HASTEN_FSDP_OFFLOAD_PARAMS": "true",
        "HASTEN_MEGATRON_LM_TP_DEGREE": "2"}
    with pytest.raises(NotYetSupportedError, match="TPU"):
        plan_for(["--tpu", script])


# ------------------------------------------------------------------------------------- the launch's value wins
def test_a_flag_wins_over_the_same_setting_inherited_from_the_shell_under_another_name(script):
    """ACCELERATE_MIXED_PRECISION=fp16 left in the shell, `--mixed_precision bf16` given: the workers see bf16 under
    both names (not two values to refuse), and the launcher says which variable it overrode."""
    args = launch_command_parser().parse_args(["--mixed_precision", "bf16", "--num_processes", "1", script])
    plan = build_plan(args, environ={"ACCELERATE_MIXED_PRECISION": "fp16", "ACCELERATE_USE_CPU": "true"},
                      cpu_count=8, count_accelerators=lambda: 0, find_free_port=lambda: 41234,
                      is_port_in_use=lambda port, host: False)
    assert plan.env["HASTEN_MIXED_PRECISION"] == plan.env["ACCELERATE_MIXED_PRECISION"] == "bf16"
    assert "ACCELERATE_USE_CPU" not in plan.env  # not set by this launch: inherited as it is
    assert any("overrides ACCELERATE_MIXED_PRECISION='fp16' inherited from the environment" in note
               for note in plan.notes), plan.notes


@pytest.mark.parametrize("flags, chosen, inherited", [
    (["--use_deepspeed", "--zero_stage", "2"], "DEEPSPEED", {"ACCELERATE_USE_FSDP": "true", "HASTEN_USE_MEGATRON_LM": "1"}),
    (["--use_fsdp"], "FSDP", {"ACCELERATE_USE_DEEPSPEED": "true"}),
])
def test_the_backend_a_launch_chooses_turns_off_other_backends_inherited_from_the_shell(script, flags, chosen,
                                                                                        inherited):
    """A test suite that ran an FSDP test in-process leaves ACCELERATE_USE_FSDP=true, then launches --use_deepspeed:
    the workers see only DeepSpeed's switch on (the launch's backend wins), and the launcher says what it turned
    off. A launch that chooses no backend leaves the inherited switches as they are."""
    args = launch_command_parser().parse_args([*flags, "--num_processes", "2", script])
    environ = {**inherited, "ACCELERATE_USE_CPU": "true"}
    plan = build_plan(args, environ=environ, cpu_count=8, count_accelerators=lambda: 0, find_free_port=lambda: 41234,
                      is_port_in_use=lambda port, host: False)
    for name in inherited:
        assert plan.env[name] == "false"
        assert any(f"trains with {chosen}; {name}=" in note and "set to false" in note for note in plan.notes)
    plain = build_plan(launch_command_parser().parse_args(["--num_processes", "2", script]), environ=environ,
                       cpu_count=8, count_accelerators=lambda: 0, find_free_port=lambda: 41234,
                       is_port_in_use=lambda port, host: False)
    assert not set(inherited) & set(plain.env)


def test_an_inherited_alias_that_agrees_with_the_launch_is_left_alone(script):
    args = launch_command_parser().parse_args(["--mixed_precision", "bf16", script])
    plan = build_plan(args, environ={"ACCELERATE_MIXED_PRECISION": "bf16"}, cpu_count=8,
                      count_accelerators=lambda: 0, find_free_port=lambda: 41234,
                      is_port_in_use=lambda port, host: False)
    assert "ACCELERATE_MIXED_PRECISION" not in plan.env and not any("overrides" in note for note in plan.notes)


def test_validate_launch_command_fills_unset_flags_from_the_config_file(tmp_path, script):
    """Accelerate's private helper (its own tests and some tools call it): the config file fills what the command
    line left unset, sections included; given flags stay."""
    from hasten.commands.launch import _validate_launch_command

    config = tmp_path / "config.yaml"
    config.write_text("compute_environment: LOCAL_MACHINE\ndebug: true\nnum_processes: 1\ndistributed_type: 'NO'\n"
                      "mixed_precision: bf16\nfsdp_config:\n  fsdp_sync_module_states: false\n")
    args = launch_command_parser().parse_args(["--num_processes", "2", "--config_file", str(config), script])
    args, defaults, precision_from_config = _validate_launch_command(args)
    assert args.debug is True and args.num_processes == 2 and args.fsdp_sync_module_states is False
    assert defaults["mixed_precision"] == "bf16" and precision_from_config is True


# ------------------------------------------------------------------------------ the parser's shown defaults
def test_a_bare_command_line_reads_like_accelerate_s():
    """Scripts and tests read parsed args back: every flag left out holds the value Accelerate's parser gives it
    (``--fsdp_sync_module_states`` "true", ``--rdzv_backend`` "static", switches False ...)."""
    accelerate_launch = pytest.importorskip("accelerate.commands.launch")
    theirs = vars(accelerate_launch.launch_command_parser().parse_args(["train.py"]))
    ours = vars(launch_command_parser().parse_args(["train.py"]))
    differ = {name: (theirs[name], ours[name]) for name in theirs if name in ours and theirs[name] != ours[name]}
    assert not differ, differ
    assert ours["fsdp_sync_module_states"] == "true" and ours["rdzv_backend"] == "static" and ours["cpu"] is False
    assert ours["nondefault"] == {"training_script", "training_script_args"}


def test_the_parser_s_defaults_do_not_override_the_config_file(tmp_path, script):
    """A value that only repeats the parser's default is no flag given: the config file's settings stand. The same
    value typed on the command line is a flag, and wins over the file."""
    from hasten.commands.launch import load_launch_config

    config = tmp_path / "config.yaml"
    config.write_text("distributed_type: FSDP\nnum_processes: 2\nrdzv_backend: c10d\n"
                      "fsdp_config:\n  fsdp_version: 2\n  fsdp_sync_module_states: false\n")
    path, settings = load_launch_config(str(config))

    def plan(*flags):
        args = launch_command_parser().parse_args(["--config_file", path, *flags, script])
        return build_plan(args, settings, path, environ={}, cpu_count=8, count_accelerators=lambda: 0,
                          find_free_port=lambda: 41234, is_port_in_use=lambda port, host: False)

    from_file = plan()
    assert from_file.env["HASTEN_FSDP_SYNC_MODULE_STATES"] == "false" and from_file.env["HASTEN_FSDP_VERSION"] == "2"
    from torch.distributed import run as torchrun

    assert torchrun.parse_args(from_file.torchrun_args).rdzv_backend == "c10d"
    typed = plan("--fsdp_sync_module_states", "true", "--fsdp_version", "1")
    assert typed.env["HASTEN_FSDP_SYNC_MODULE_STATES"] == "true" and typed.env["HASTEN_FSDP_VERSION"] == "1"


def test_a_namespace_built_by_code_counts_what_differs_from_the_defaults(script):
    """Callers build a Namespace by hand (no record of what was typed): a value other than the parser's default
    is given, the default itself is not; ``given_flags`` leaves the caller's namespace as it was."""
    import argparse

    from hasten.commands.launch_defaults import given_flags

    args = argparse.Namespace(**vars(launch_command_parser().parse_args([script])))
    del args.nondefault
    args.fsdp_version, args.rdzv_backend = "2", "static"
    view = given_flags(args)
    assert view.fsdp_version == "2" and view.rdzv_backend is None and view.cpu is None
    assert args.rdzv_backend == "static" and args.cpu is False
    assert given_flags(view).fsdp_version == "2"
    env = plan_for(["--use_fsdp", script]).env
    assert env["HASTEN_USE_FSDP"] == "true" and "HASTEN_FSDP_VERSION" not in env  # the plugin's own default stands


def test_validate_launch_command_puts_the_config_file_over_the_parser_s_defaults(tmp_path, script):
    """Accelerate's helper: a flag left out takes the config file's value even though the parser filled it (the
    FSDP switches read "true" before); typed flags stay."""
    from hasten.commands.launch import _validate_launch_command

    config = tmp_path / "config.yaml"
    config.write_text("compute_environment: LOCAL_MACHINE\ndebug: true\nnum_processes: 1\ndistributed_type: 'NO'\n"
                      "rdzv_backend: c10d\nfsdp_config:\n  fsdp_sync_module_states: false\n  fsdp_use_orig_params: false\n"
                      "deepspeed_config:\n  deepspeed_config_file: from/the/file.json\n")
    args = launch_command_parser().parse_args(["--num-processes", "2", "--deepspeed_config_file", "given.json",
                                               "--fsdp_use_orig_params", "true", "--config-file", str(config),
                                               script])
    assert not args.debug and args.fsdp_sync_module_states == "true" and args.rdzv_backend == "static"
    _validate_launch_command(args)
    assert args.debug is True and args.num_processes == 2 and args.rdzv_backend == "c10d"
    assert args.fsdp_sync_module_states is False and args.fsdp_use_orig_params == "true"
    assert args.deepspeed_config_file == "given.json"
