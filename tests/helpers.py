"""Shared test helpers: launching multi-process scripts with ``hasten launch``."""
from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
from pathlib import Path

from warm_launch import warm_launch, warm_torchrun

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
_LOCK = Path(os.environ.get("HASTEN_TEST_LOCK", "/tmp/hasten-multiprocess-tests.lock"))


@contextlib.contextmanager
def one_multiprocess_job_at_a_time():
    """This machine has 2 cores: two multi-process jobs at once would only make both slow and flaky."""
    with open(_LOCK, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def torch_extensions_dir(variant: str = "") -> Path:
    """Where DeepSpeed's CPU ops, compiled on first use (30-60 s each), are kept for this checkout: torch's extension
    cache under a folder named after the checkout's path. A build holds the paths of the installation it was
    compiled from, so two checkouts sharing one folder would rebuild each other's ops in turn; one folder per checkout
    (and per ``variant``: another installation path, such as a site-packages mirror) compiles each op once."""
    import hashlib

    key = hashlib.sha1(str(ROOT).encode()).hexdigest()[:12]
    return Path.home() / ".cache" / "torch_extensions" / f"hasten-tests-{key}{'-' + variant if variant else ''}"


def clean_env(**extra) -> dict:
    """The current environment without launcher variables (so a test is never 'already launched')."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HASTEN_", "ACCELERATE_", "SLURM_")) and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                                         "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK", "ROLE_RANK")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    env.update({k: str(v) for k, v in extra.items()})
    return env


def script_path(name: str) -> Path:
    """The launched script called ``name``: scripts live beside the tests that launch them (tests/<room>/)."""
    found = sorted(TESTS.rglob(name))
    if len(found) != 1:
        raise FileNotFoundError(f"{len(found)} scripts called {name} under {TESTS}: {found}")
    return found[0]


def run_launch(script, *script_args, num_processes: int | None = 2, launch_args=(), timeout: float = 240,
               env: dict | None = None, check: bool = True, warm: bool = True,
               preload: tuple = ()) -> subprocess.CompletedProcess:
    """Run ``hasten launch [-n N] [launch_args] script [script_args]`` and return the finished process.

    ``script`` is a path or the file name of a script beside the tests that launch it, anywhere under tests/
    (``script_path``; a module name when ``-m`` is among ``launch_args``). ``num_processes=None`` leaves ``-n`` out
    (e.g. a config file decides). With ``check`` a non-zero exit fails the test and shows the job's output.

    With ``warm`` (the default) the workers are forked from a process that already imported torch and hasten (and
    the modules in ``preload``, which the script imports at its start anyway), planned by hasten launch's own code:
    see ``warm_launch``. ``warm=False`` is for the tests whose subject is the launcher itself.
    """
    target = str(script)
    is_module = "-m" in launch_args or "--module" in launch_args
    if not is_module and not Path(target).is_absolute() and not Path(target).exists():
        target = str(script_path(target))
    layout = ["-n", str(num_processes)] if num_processes is not None else []
    launch_argv = [*layout, *launch_args, target, *map(str, script_args)]
    command = [sys.executable, "-m", "hasten", "launch", *launch_argv]
    env = env if env is not None else clean_env()
    with one_multiprocess_job_at_a_time():
        result = warm_launch(launch_argv, env, ROOT, timeout, preload) if warm else None
        if result is None:
            result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    if check and result.returncode != 0:
        raise AssertionError(
            f"{' '.join(command)} exited with {result.returncode}\n--- stdout\n{result.stdout[-6000:]}\n"
            f"--- stderr\n{result.stderr[-10000:]}"
        )
    return result


def run_torchrun(script, *script_args, num_processes: int = 2, timeout: float = 600, env: dict | None = None,
                 preload: tuple = ()) -> subprocess.CompletedProcess:
    """Run ``torchrun --nproc_per_node N script [script_args]`` (the reference library's side of a comparison) and
    return the finished process, not checked. Warm, as ``run_launch`` (``warm_launch.warm_torchrun``)."""
    script = str(script_path(script) if not Path(str(script)).is_absolute() else script)
    arguments = list(map(str, script_args))
    env = env if env is not None else clean_env()
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(num_processes), script,
               *arguments]
    with one_multiprocess_job_at_a_time():
        result = warm_torchrun(script, arguments, num_processes, env, ROOT, timeout, preload)
        if result is None:
            result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)
    return result


def assert_checkpoint_loads_on_one_process(model, checkpoint, weights_file) -> None:
    """``model`` prepared on this one process loads ``checkpoint`` (written by a multi-process layout) into exactly
    the weights the launched script saved in ``weights_file``."""
    import torch

    from hasten import Accelerator

    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(model)
    accelerator.load_state(checkpoint)
    expected = torch.load(weights_file, weights_only=True)
    loaded = model.state_dict()
    assert loaded.keys() == expected.keys()
    assert all(torch.equal(loaded[key], expected[key]) for key in expected)


def site_packages_without(folder, *names: str) -> Path:
    """A copy of this interpreter's site-packages (links to every entry) without the distributions ``names``
    (their packages and .dist-info folders), as ``folder``/site-packages: where a test must show that something
    works with them absent. A mirror already there is brought up to date (a folder kept between runs)."""
    import sysconfig

    site = Path(sysconfig.get_paths()["purelib"])
    mirror = Path(folder) / "site-packages"
    mirror.mkdir(parents=True, exist_ok=True)
    wanted = {entry.name: entry for entry in site.iterdir()
              if not any(entry.name == name or entry.name.startswith(f"{name}-") for name in names)}
    for link in mirror.iterdir():
        if link.name not in wanted or link.resolve() != wanted[link.name].resolve():
            link.unlink()
    for name, entry in wanted.items():
        if not (mirror / name).is_symlink():
            (mirror / name).symlink_to(entry)
    return mirror


def python_with_site(mirror: Path) -> list:
    """The command that runs a script with ``mirror`` as the only site-packages (its .pth files processed, so the
    editable install and hasten's start-up hook work): ``[*python_with_site(mirror), script, *args]``."""
    bootstrap = ("import runpy, site, sys; sys.path[:] = [p for p in sys.path if 'site-packages' not in p]; "
                 f"site.addsitedir({str(mirror)!r}); script = sys.argv[1]; sys.argv = sys.argv[1:]; "
                 "sys.path.insert(0, __import__('os').path.dirname(script)); runpy.run_path(script, run_name='__main__')")
    return [sys.executable, "-S", "-c", bootstrap]


def run_real_launch(script, *script_args, **options) -> subprocess.CompletedProcess:
    """``run_launch`` through a real ``hasten launch`` process (torchrun's agent starts fresh workers): for the tests
    whose subject is the launcher itself."""
    return run_launch(script, *script_args, warm=False, **options)
