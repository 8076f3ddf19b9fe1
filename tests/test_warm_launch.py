"""The suite's warm start (warm_launch.py, warm_zygote.py) stands in for ``hasten launch`` exactly: the same
worker's view of its environment, rank variables, thread count, arguments and settings as a real launch; a failing
rank's traceback and a non-zero status; and the real launcher for what only it can do."""
import json

from helpers import ROOT, clean_env, run_launch, run_real_launch
from warm_launch import warm_launch

FLAGS = ["--mixed_precision", "bf16", "--gradient_accumulation_steps", "2"]


def views(result) -> list:
    """Each rank's view, in rank order, less its random seed (``seeds``)."""
    found = sorted((json.loads(line[5:]) for line in result.stdout.splitlines() if line.startswith("VIEW ")),
                   key=lambda view: view["index"])
    return [{key: value for key, value in view.items() if key != "seed"} for view in found]


def seeds(result) -> list:
    return [json.loads(line[5:])["seed"] for line in result.stdout.splitlines() if line.startswith("VIEW ")]


def test_a_warm_start_gives_the_workers_what_hasten_launch_gives_them():
    script = str(ROOT / "tests" / "check_worker_view.py")
    warm = warm_launch([*FLAGS, "-n", "2", script, "a", "b c"], clean_env(), ROOT, 120)
    real = run_real_launch("check_worker_view.py", "a", "b c", launch_args=FLAGS)
    assert warm is not None and warm.returncode == 0, warm.stderr if warm else "no warm start"
    assert views(warm) == views(real) and len(views(real)) == 2, (views(warm), views(real))
    first = views(real)[0]
    assert first["mixed_precision"] == "bf16" and first["accumulation"] == 2 and first["processes"] == 2
    assert first["argv"][1:] == ["a", "b c"] and first["name"] == "__main__"
    # every worker draws its own random numbers, as a fresh process does (forks would share the zygote's)
    again = warm_launch([*FLAGS, "-n", "2", script], clean_env(), ROOT, 120)
    assert len(set(seeds(warm) + seeds(again))) == 4


def test_a_failing_rank_fails_the_warm_job_with_its_traceback():
    result = run_launch("check_worker_view.py", "fail", check=False)
    assert result.returncode != 0 and "(warm)" in result.args
    assert "ValueError: deliberate failure on rank 1" in result.stderr and "check_worker_view.py" in result.stderr


def test_what_only_the_real_launcher_does_is_left_to_it(monkeypatch):
    assert warm_launch(["--max_restarts", "1", "-n", "2", "tests/check_worker_view.py"], clean_env(), ROOT, 60) is None
    assert warm_launch(["-n", "2", "--no_such_flag", "tests/check_worker_view.py"], clean_env(), ROOT, 60) is None
    monkeypatch.setenv("HASTEN_TEST_REAL_LAUNCH", "1")
    assert warm_launch(["-n", "2", "tests/check_worker_view.py"], clean_env(), ROOT, 60) is None
