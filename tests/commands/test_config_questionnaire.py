"""`hasten config` answered through a real pseudo-terminal, keys typed as a person would; the file written is then
planned by `hasten launch` (nothing is started) and read by the plugins it configures."""
import io
import os
import subprocess
import sys

import pexpect
import pytest
import yaml

from launch_fixtures import no_launch, plan_for, script  # noqa: F401 - fixtures

DOWN, UP, ENTER, CTRL_C, CTRL_D = "\x1b[B", "\x1b[A", "\r", "\x03", "\x04"
HASTEN = [sys.executable, "-c", "import sys; from hasten.commands.cli import main; sys.exit(main())"]


def _spawn(tmp_path, term="xterm", name="asked.yaml"):
    env = {key: value for key, value in os.environ.items() if not key.startswith(("HASTEN_", "ACCELERATE_"))}
    env.update(TERM=term, HASTEN_CONFIG_HOME=str(tmp_path / "home"), COLUMNS="120", LINES="40")
    target = tmp_path / name
    child = pexpect.spawn(HASTEN[0], HASTEN[1:] + ["config", "--config_file", str(target)], env=env,
                          encoding="utf-8", timeout=20, dimensions=(40, 120))
    child.logfile_read = io.StringIO()  # the whole transcript, for the checks on what was shown
    return child, target


def _answer(child, steps):
    """``steps``: (text the question contains, keys typed). Every question must come before its keys are typed."""
    for question, keys in steps:
        child.expect_exact(question)
        child.send(keys)


def _finish(child):
    child.expect(pexpect.EOF)
    child.close()
    return child.exitstatus, child.logfile_read.getvalue()


# ------------------------------------------------------------------------------------------ DDP, arrow-key menus
DDP_ANSWERS = [
    ("compute environment", ENTER),                         # this machine
    ("type of machine", DOWN + DOWN + ENTER),               # multi-GPU
    ("How many machines", "two\r"),                         # not a number: asked again
    ("not a whole number", "2\r"),
    ("rank of this machine", "5\r"),                        # out of range: asked again
    ("too large", "1\r"),
    ("IP address", "not an address!\r"),
    ("neither an IP address", "10.0.0.5\r"),
    ("port", ENTER),                                        # 29500
    ("same local network", "n\r"),
    ("rendezvous backend", DOWN + ENTER),                   # c10d
    ("How many GPUs in total", "3\r"),                      # not a multiple of 2 machines
    ("cannot be split evenly", "4\r"),
    ("share the model", ENTER),                             # DDP
    ("Check distributed operations", "y\r"),
    ("torch.compile?", "yes\r"),
    ("torch.compile backend", ENTER),                       # inductor (the default)
    ("choose the mode", "y\r"),
    ("Which mode", DOWN + ENTER),                           # the second mode
    ("fullgraph", "y\r"),
    ("dynamic", "\r"),
    ("regional compilation", "n\r"),
    ("Which GPUs", "0\r"),                                  # 1 id for 2 processes: asked again
    ("at least 2", "0, 1\r"),
    ("NUMA node", "\r"),
    ("mixed precision", DOWN + DOWN + ENTER),               # bf16
]


def test_ddp_answers_through_the_arrow_menus_are_what_hasten_launch_plans(tmp_path, script, no_launch):  # noqa: F811
    from hasten.commands.launch import load_launch_config
    from hasten.utils.constants import TORCH_DYNAMO_MODES

    child, target = _spawn(tmp_path)
    _answer(child, DDP_ANSWERS)
    status, output = _finish(child)
    assert status == 0, output
    assert f"saved {target}" in output and "\x1b[?25l" in output  # the menus ran (cursor hidden while choosing)
    written = yaml.safe_load(target.read_text())
    assert written["distributed_type"] == "MULTI_GPU" and written["mixed_precision"] == "bf16"
    assert (written["num_machines"], written["machine_rank"], written["main_process_ip"]) == (2, 1, "10.0.0.5")
    assert (written["main_process_port"], written["same_network"], written["rdzv_backend"]) == (29500, False, "c10d")
    assert (written["num_processes"], written["gpu_ids"], written["debug"]) == (4, "0,1", True)
    assert written["dynamo_config"] == {"dynamo_backend": "INDUCTOR", "dynamo_mode": TORCH_DYNAMO_MODES[1],
                                        "dynamo_use_fullgraph": True, "dynamo_use_dynamic": False,
                                        "dynamo_use_regional_compilation": False}
    assert "fsdp_config" not in written and "parallelism_config" not in written

    path, settings = load_launch_config(str(target))
    plan = plan_for(["--config_file", path, script], settings, path)
    args = plan.torchrun_args
    assert args[args.index("--nnodes") + 1] == "2" and args[args.index("--nproc_per_node") + 1] == "2"
    assert args[args.index("--rdzv_backend") + 1] == "c10d"
    assert args[args.index("--rdzv_endpoint") + 1] == "10.0.0.5:29500"
    env = plan.env
    assert (env["HASTEN_MIXED_PRECISION"], env["HASTEN_DYNAMO_BACKEND"], env["CUDA_VISIBLE_DEVICES"]) == \
        ("bf16", "INDUCTOR", "0,1")
    assert env["HASTEN_DEBUG_MODE"] == "true" and env["HASTEN_DYNAMO_USE_FULLGRAPH"] == "true"
    assert "HASTEN_USE_FSDP" not in env and "HASTEN_USE_DEEPSPEED" not in env


# ------------------------------------------------------------------------------------------ FSDP, digits in the menus
FSDP_ANSWERS = [
    ("compute environment", "0" + ENTER),
    ("type of machine", "2" + ENTER),                       # multi-GPU, by its digit
    ("How many machines", ENTER),                           # 1
    ("How many GPUs in total", "4\r"),
    ("share the model", "1" + ENTER),                       # FSDP
    ("FSDP version", ENTER),                                # 2
    ("again after forward", "no\r"),
    ("Offload parameters", ENTER),
    ("auto wrap policy", ENTER),                            # by transformer layer class
    ("Layer class names", "GPT2 Block\r"),                  # not a class name: asked again
    ("is not a class name", "GPT2Block, GPT2MLP\r"),
    ("state dict type", DOWN + ENTER),                      # FULL_STATE_DICT
    ("CPU RAM efficient loading", "y\r"),
    ("activation checkpointing", "y\r"),
    ("Combine FSDP with tensor parallelism", "y\r"),
    ("Tensor-parallel size", "3\r"),                        # does not divide 4: asked again
    ("does not divide 4", "2\r"),
    ("how many replicas", ENTER),                           # 1: the other 2 ways shard
    ("Check distributed operations", ENTER),
    ("torch.compile?", ENTER),
    ("Which GPUs", ENTER),                                  # all
    ("NUMA node", ENTER),
    ("mixed precision", "2" + ENTER),                       # bf16
]


def test_fsdp_answers_reach_the_fsdp_plugin_and_the_parallelism_config(tmp_path, script, no_launch,  # noqa: F811
                                                                       monkeypatch):
    from hasten.commands.launch import load_launch_config

    child, target = _spawn(tmp_path)
    _answer(child, FSDP_ANSWERS)
    status, output = _finish(child)
    assert status == 0, output
    written = yaml.safe_load(target.read_text())
    assert written["distributed_type"] == "FSDP" and written["num_processes"] == 4
    assert written["fsdp_config"] == {
        "fsdp_version": 2, "fsdp_reshard_after_forward": False, "fsdp_offload_params": False,
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "fsdp_transformer_layer_cls_to_wrap": "GPT2Block,GPT2MLP",
        "fsdp_state_dict_type": "FULL_STATE_DICT", "fsdp_cpu_ram_efficient_loading": True,
        "fsdp_activation_checkpointing": True}
    assert written["parallelism_config"] == {"parallelism_config_dp_replicate_size": 1,
                                             "parallelism_config_dp_shard_size": 2, "parallelism_config_tp_size": 2}

    path, settings = load_launch_config(str(target))
    plan = plan_for(["--config_file", path, script], settings, path)
    env = plan.env
    assert env["HASTEN_USE_FSDP"] == "true" and env["HASTEN_FSDP_VERSION"] == "2"
    assert env["HASTEN_FSDP_TRANSFORMER_CLS_TO_WRAP"] == "GPT2Block,GPT2MLP"
    assert env["HASTEN_USE_PARALLELISM_CONFIG"] == "true" and env["HASTEN_PARALLELISM_CONFIG_TP_SIZE"] == "2"

    from hasten.parallel.resolve import resolve_parallelism_config
    from hasten.utils import FullyShardedDataParallelPlugin

    for name in [name for name in os.environ if name.startswith(("HASTEN_", "ACCELERATE_", "FSDP_"))]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    plugin = FullyShardedDataParallelPlugin()
    assert (plugin.fsdp_version, plugin.reshard_after_forward, plugin.activation_checkpointing) == (2, False, True)
    assert plugin.transformer_cls_names_to_wrap == ["GPT2Block", "GPT2MLP"]
    sizes = resolve_parallelism_config(env=env)
    assert (sizes.dp_replicate_size, sizes.dp_shard_size, sizes.tp_size) == (1, 2, 2)


# ------------------------------------------------------------------------------------------ DeepSpeed, plain prompts
DEEPSPEED_ANSWERS = [
    ("compute environment", "0\r"),
    ("type of machine", "multi\r"),                         # not a choice: asked again
    ("is not one of the choices", "2\r"),
    ("How many machines", "\r"),
    ("How many GPUs in total", "1\r"),                      # "multi": at least 2
    ("too small", "2\r"),
    ("share the model", "2\r"),                             # DeepSpeed
    ("DeepSpeed JSON config file", "n\r"),
    ("ZeRO stage", "\r"),                                   # 2
    ("optimizer states be offloaded", "1\r"),               # cpu
    ("accumulated over", "0\r"),
    ("too small", "4\r"),
    ("Clip gradients", "y\r"),
    ("Largest gradient norm", "abc\r"),
    ("is not a number", "1.5\r"),
    ("Check distributed operations", "\r"),
    ("torch.compile?", "\r"),
    ("Which GPUs", "\r"),
    ("NUMA node", "\r"),
    ("mixed precision", "9\r"),
    ("from 0 to 3", "fp16\r"),                              # a choice's text works too
]


def test_deepspeed_answers_with_plain_numbered_prompts_on_a_dumb_terminal(tmp_path, script, no_launch):  # noqa: F811
    from hasten.commands.launch import load_launch_config

    child, target = _spawn(tmp_path, term="dumb")
    _answer(child, DEEPSPEED_ANSWERS)
    status, output = _finish(child)
    assert status == 0, output
    assert "\x1b[" not in output and "[1] multi-CPU" in output  # numbered choices, no cursor movements
    written = yaml.safe_load(target.read_text())
    assert written["distributed_type"] == "DEEPSPEED" and written["mixed_precision"] == "fp16"
    assert written["deepspeed_config"] == {"zero_stage": 2, "offload_optimizer_device": "cpu",
                                           "gradient_accumulation_steps": 4, "gradient_clipping": 1.5}
    path, settings = load_launch_config(str(target))
    env = plan_for(["--config_file", path, script], settings, path).env
    assert env["HASTEN_USE_DEEPSPEED"] == "true" and env["HASTEN_DEEPSPEED_ZERO_STAGE"] == "2"
    assert (env["HASTEN_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE"], env["HASTEN_GRADIENT_ACCUMULATION_STEPS"],
            env["HASTEN_GRADIENT_CLIPPING"]) == ("cpu", "4", "1.5")


# ------------------------------------------------------------------------------------------ leaving early
def test_without_a_terminal_the_command_says_what_to_use_instead(tmp_path):
    result = subprocess.run(HASTEN + ["config", "--config_file", str(tmp_path / "c.yaml")], stdin=subprocess.DEVNULL,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "needs a terminal" in result.stderr and "hasten config default" in result.stderr
    assert "--num_processes" in result.stderr and not (tmp_path / "c.yaml").exists()


@pytest.mark.parametrize("keys, status, message", [
    ([("compute environment", CTRL_C)], 130, "cancelled; nothing was saved"),
    ([("compute environment", ENTER), ("type of machine", ENTER), ("CPU only", CTRL_D)], 2, "the input ended"),
    ([("compute environment", DOWN + ENTER)], 2, "SageMaker is not yet supported"),
])
def test_leaving_early_keeps_the_existing_file(tmp_path, keys, status, message):
    child, target = _spawn(tmp_path)
    target.write_text("distributed_type: NO\n")
    _answer(child, keys)
    code, output = _finish(child)
    assert code == status and message in output and "Traceback" not in output, output
    assert target.read_text() == "distributed_type: NO\n"


# ------------------------------------------------------------------------------------------ the prompts themselves
class Typed:
    """Lines typed at `input()`; records the prompts shown."""

    def __init__(self, *lines):
        self.lines, self.prompts = list(lines), []

    def __call__(self, prompt=""):
        self.prompts.append(prompt)
        if not self.lines:
            raise EOFError
        return self.lines.pop(0)


def test_prompts_ask_again_until_the_answer_fits(monkeypatch, capsys):
    import builtins

    from hasten.commands.config import questions

    monkeypatch.setattr(builtins, "input", Typed("1.5", "1e8"))
    assert questions.ask_int("Parameters?", 5, minimum=1) == 100_000_000
    assert "'1.5' is not a whole number" in capsys.readouterr().out
    monkeypatch.setattr(builtins, "input", Typed("-1", "inf", "0.25"))
    assert questions.ask_float("Norm?", 1.0, minimum=0.0) == 0.25
    out = capsys.readouterr().out
    assert "too small" in out and "not a finite number" in out
    typed = Typed("maybe", "")
    monkeypatch.setattr(builtins, "input", typed)
    assert questions.ask_bool("Offload?", default=True) is True and typed.prompts[0] == "Offload? [YES/no]: "
    monkeypatch.setattr(builtins, "input", Typed("", "x"))
    assert questions.ask_text("Name") == "x" and "An answer is needed" in capsys.readouterr().out
    monkeypatch.setattr(builtins, "input", Typed())
    with pytest.raises(questions.InputEnded, match="nothing was saved"):
        questions.ask_int("Processes?", 2)


@pytest.mark.parametrize("term, readable, line_mode", [("dumb", True, True), ("", True, True),
                                                        ("xterm", False, True), ("xterm", True, False)])
def test_menus_fall_back_to_numbered_prompts_where_keys_cannot_be_read(monkeypatch, term, readable, line_mode):
    from hasten.commands.menu import selection_menu

    monkeypatch.setenv("TERM", term)
    monkeypatch.setattr(selection_menu.sys.stdin, "isatty", lambda: True, raising=False)
    monkeypatch.setattr(selection_menu.sys.stdout, "isatty", lambda: True, raising=False)
    monkeypatch.setattr(selection_menu, "_raw_keys_readable", lambda: readable)
    assert selection_menu._line_mode() is line_mode


def _answered(monkeypatch, tmp_path, *lines):
    """The config file the questionnaire writes for ``lines`` typed at numbered prompts (in this process)."""
    import builtins

    from hasten.commands.config.cluster import get_cluster_input
    from hasten.commands.menu import selection_menu

    monkeypatch.setattr(selection_menu, "_line_mode", lambda: True)
    typed = Typed(*lines)
    monkeypatch.setattr(builtins, "input", typed)
    path = tmp_path / "asked.yaml"
    get_cluster_input().to_yaml_file(str(path))
    assert not typed.lines, f"questions left unasked: {typed.lines}"
    return str(path)


def test_tensor_parallel_sizes_multiply_to_the_processes(tmp_path, monkeypatch, script, no_launch,  # noqa: F811
                                                         capsys):
    from hasten.commands.launch import load_launch_config

    # multi-GPU, 1 machine, 8 GPUs, tensor parallelism: tp 3 (refused) then 2, 3 of the 4 groups shard
    # (refused) then 2, no debug, no compile, all GPUs, no pinning, bf16
    path = _answered(monkeypatch, tmp_path, "2", "1", "8", "3", "3", "2", "3", "2", "", "", "", "", "2")
    assert "does not divide 8" in capsys.readouterr().out
    written = yaml.safe_load(open(path).read())
    assert written["distributed_type"] == "MULTI_GPU" and written["parallelism_config"] == {
        "parallelism_config_dp_replicate_size": 2, "parallelism_config_dp_shard_size": 2,
        "parallelism_config_tp_size": 2}
    config_path, settings = load_launch_config(path)
    env = plan_for(["--config_file", config_path, script], settings, config_path).env
    assert (env["HASTEN_PARALLELISM_CONFIG_TP_SIZE"], env["HASTEN_PARALLELISM_CONFIG_DP_SHARD_SIZE"],
            env["HASTEN_PARALLELISM_CONFIG_DP_REPLICATE_SIZE"]) == ("2", "2", "2")


def test_a_deepspeed_json_file_keeps_its_own_settings(tmp_path, monkeypatch, script, no_launch, capsys):  # noqa: F811
    from hasten.commands.launch import load_launch_config

    ds_file = tmp_path / "ds.json"
    ds_file.write_text('{"zero_optimization": {"stage": 3}, "bf16": {"enabled": true}}')
    (tmp_path / "bad.json").write_text('{"train_batch_size": 8}')
    # multi-GPU, 1 machine, 2 GPUs, DeepSpeed, with a JSON file: a missing one, one without zero_optimization,
    # then the right one; zero.Init yes; no debug, no compile, all GPUs, no pinning (no precision question)
    path = _answered(monkeypatch, tmp_path, "2", "", "2", "2", "y", str(tmp_path / "none.json"),
                     str(tmp_path / "bad.json"), str(ds_file), "y", "", "", "", "")
    out = capsys.readouterr().out
    assert "does not exist" in out and "no 'zero_optimization' section" in out
    written = yaml.safe_load(open(path).read())
    assert written["deepspeed_config"] == {"deepspeed_config_file": str(ds_file), "zero3_init_flag": True}
    assert "mixed_precision" not in written
    config_path, settings = load_launch_config(path)
    env = plan_for(["--config_file", config_path, script], settings, config_path).env
    assert env["HASTEN_DEEPSPEED_CONFIG_FILE"] == str(ds_file) and env["HASTEN_DEEPSPEED_ZERO3_INIT"] == "true"


def test_megatron_answers_reach_the_megatron_plugin(tmp_path, monkeypatch, script, no_launch, capsys):  # noqa: F811
    from hasten.commands.launch import load_launch_config
    from hasten.utils import MegatronLMPlugin

    # multi-GPU, 1 machine, 8 GPUs, Megatron-LM: tp 3 (refused) then 2, pp 2, 4 micro-batches, sequence
    # parallelism yes, recompute yes, distributed optimizer yes, clipping 0.5; no debug, no compile, all GPUs,
    # no pinning, bf16
    path = _answered(monkeypatch, tmp_path, "2", "1", "8", "4", "3", "2", "2", "4", "y", "y", "y", "0.5",
                     "", "", "", "", "2")
    assert "does not divide 8" in capsys.readouterr().out
    written = yaml.safe_load(open(path).read())
    assert written["distributed_type"] == "MEGATRON_LM" and written["megatron_lm_config"] == {
        "megatron_lm_tp_degree": 2, "megatron_lm_pp_degree": 2, "megatron_lm_num_micro_batches": 4,
        "megatron_lm_sequence_parallelism": True, "megatron_lm_recompute_activations": True,
        "megatron_lm_use_distributed_optimizer": True, "megatron_lm_gradient_clipping": 0.5}
    config_path, settings = load_launch_config(path)
    env = plan_for(["--config_file", config_path, script], settings, config_path).env
    for key, value in env.items():
        if key.startswith("HASTEN_"):
            monkeypatch.setenv(key, value)
    plugin = MegatronLMPlugin()
    assert (plugin.tp_degree, plugin.pp_degree, plugin.num_micro_batches, plugin.gradient_clipping) == (2, 2, 4, 0.5)
    assert plugin.sequence_parallelism and plugin.recompute_activations and plugin.use_distributed_optimizer


def test_a_multi_cpu_machine_is_offered_every_backend(tmp_path, monkeypatch, script, no_launch):  # noqa: F811
    from hasten.commands.launch import load_launch_config

    # multi-CPU, 1 machine, 2 processes, FSDP: version 2, reshard (default), no offload, wrap by layer class
    # "Block", state dict (default), CPU-RAM-efficient loading (default), no activation checkpointing, no TP;
    # no debug, no compile, bf16
    path = _answered(monkeypatch, tmp_path, "1", "", "2", "1", "", "", "", "", "Block", "", "", "", "", "", "",
                     "2")
    written = yaml.safe_load(open(path).read())
    assert written["distributed_type"] == "FSDP" and written["use_cpu"] is True and written["num_processes"] == 2
    assert written["fsdp_config"]["fsdp_version"] == 2
    config_path, settings = load_launch_config(path)
    env = plan_for(["--config_file", config_path, script], settings, config_path).env
    assert env["HASTEN_USE_FSDP"] == "true" and env["HASTEN_FSDP_VERSION"] == "2"


def test_fp8_answers_become_the_torchao_options_of_the_launch(tmp_path, monkeypatch, script, no_launch,  # noqa: F811
                                                              capsys):
    from hasten.commands.launch import load_launch_config

    # one process, on the CPU only, no compile, fp8 (the 4th precision); FSDP2 fp8 all-gather: no; padding: default
    path = _answered(monkeypatch, tmp_path, "0", "yes", "", "3", "n", "")
    assert "torchao" in capsys.readouterr().out
    written = yaml.safe_load(open(path).read())
    assert written["mixed_precision"] == "fp8"
    assert written["fp8_config"] == {"backend": "AO", "enable_fsdp_float8_all_gather": False, "pad_inner_dim": True}
    config_path, settings = load_launch_config(path)
    env = plan_for(["--config_file", config_path, script], settings, config_path).env
    assert (env["HASTEN_MIXED_PRECISION"], env["HASTEN_FP8_BACKEND"], env["HASTEN_FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER"],
            env["HASTEN_FP8_PAD_INNER_DIM"]) == ("fp8", "AO", "false", "true")
