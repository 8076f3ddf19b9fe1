"""Accelerate's documented mid-epoch resume loop (divmod by len(train_dataloader), skip_first_batches for the
interrupted epoch) resumes bitwise exactly on 2 real processes: an uninterrupted run, a run that dies after a
checkpoint, and its resume are three separate `hasten launch -n 2` jobs."""
import importlib.util

from helpers import run_launch


def test_the_documented_resume_loop_resumes_bitwise_exactly_on_two_processes(tmp_path):
    for phase in ("reference", "stop", "resume"):
        result = run_launch("check_documented_resume.py", phase, tmp_path, num_processes=2, timeout=300)
        assert f"check_documented_resume {phase} OK" in result.stdout
    variants = ["default", "seedable", "dispatch"]
    if importlib.util.find_spec("torchdata") is not None:
        variants.append("stateful")
    for variant in variants:
        assert f"rank 1: {variant} resume OK" in result.stdout
