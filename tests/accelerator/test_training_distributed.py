"""The Accelerator's training loop on 2 real processes, and the examples that `make demo` shows."""
from helpers import ROOT, run_launch


def test_training_core_two_processes():
    result = run_launch("check_training.py", num_processes=2, timeout=300)
    assert "check_training OK on 2 processes" in result.stdout


def test_demo_and_by_feature_examples():
    result = run_launch(ROOT / "examples" / "demo.py", num_processes=2, timeout=300)
    assert "demo OK: 2 process(es), bf16 precision" in result.stdout
    result = run_launch(ROOT / "examples" / "by_feature" / "evaluation.py", num_processes=2)
    assert "evaluation example OK" in result.stdout
    result = run_launch(ROOT / "examples" / "by_feature" / "gradient_accumulation.py", num_processes=2)
    assert "gradient accumulation example OK" in result.stdout


def test_init_process_group_timeout_bounds_collectives():
    result = run_launch("check_timeout.py", num_processes=2, timeout=120)
    assert "timeout honoured" in result.stdout


def test_calls_the_reference_allows_on_the_main_process_only_work_there_and_everywhere(tmp_path):
    """init_trackers / log / get_tracker / end_training (diffusers' pattern: trackers on the main process, log on
    every one), save / save_model / get_state_dict / unwrap_model / print: each made on every process and on the
    main process only, with a 20 s process-group timeout so that a call waiting for absent processes fails."""
    result = run_launch("check_main_only_calls.py", tmp_path, num_processes=2, timeout=180)
    assert "MAIN ONLY CALLS OK" in result.stdout
