"""Install DeepSpeed with its CPU ops compiled in, built once per machine (``make venv`` runs this for the tests).

DeepSpeed compiles the ops it needs on a CPU machine (CPU Adam, fused Adam, shared-memory collectives) the first
time a process uses them, into torch's extension folder. That build is tied to the paths of the installation it
was made for, so every fresh clone (a new ``.venv``) compiled them again: minutes of every clean ``make test``.
Here DeepSpeed's own setup builds them into a wheel instead (``DS_BUILD_<OP>=1``), kept in
``~/.cache/hasten-build/`` under a name that holds everything the compiled code depends on (DeepSpeed's, torch's
and Python's versions, and this CPU's instruction sets, as the ops are compiled for the machine's CPU). A later
clone installs that wheel in seconds; DeepSpeed then imports the compiled ops and compiles nothing.

Nothing here is needed for DeepSpeed to work: when the build cannot be made (no compiler, a CUDA torch, no
network for the source), this says why and exits 0, and DeepSpeed compiles its ops on first use, as it always did.

    python build_support/deepspeed_cpu_ops.py [REQUIREMENT]    # default: deepspeed
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

OPS = ("CPU_ADAM", "FUSED_ADAM", "SHM_COMM")  # what hasten's DeepSpeed runs load on CPU
BUILD_TOOLS = ("setuptools", "wheel", "packaging", "py-cpuinfo", "ninja")


def _say(message: str) -> None:
    print(f"deepspeed_cpu_ops: {message}", flush=True)


def _pip(*args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, env=env)


def _cpu_signature() -> str:
    """The CPU's instruction sets: ops compiled with -march=native run only where these are the same."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        flags = os.uname().machine
    return hashlib.sha1(flags.encode()).hexdigest()[:12]


def _cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hasten-build"


def _source(requirement: str, into: Path) -> Path:
    """The source distribution pip picks for ``requirement`` (its version names the cache entry)."""
    result = _pip("download", "-q", "--no-deps", "--no-binary", ":all:", requirement, "-d", str(into))
    found = sorted(into.glob("deepspeed-*.tar.gz"))
    if result.returncode != 0 or not found:
        raise RuntimeError(f"pip download {requirement} failed: {result.stderr.strip()[-500:]}")
    return found[0]


def _build(source: Path, into: Path) -> Path:
    tools = _pip("install", "-q", *BUILD_TOOLS)
    if tools.returncode != 0:
        raise RuntimeError(f"installing the build tools failed: {tools.stderr.strip()[-500:]}")
    env = dict(os.environ, DS_ACCELERATOR="cpu", DS_BUILD_OPS="0", DS_ENABLE_NINJA="1",
               MAX_JOBS=str(os.cpu_count() or 1), **{f"DS_BUILD_{op}": "1" for op in OPS})
    result = _pip("wheel", "-q", "--no-deps", "--no-build-isolation", "--no-cache-dir", str(source), "-w",
                  str(into), env=env)
    wheels = sorted(into.glob("deepspeed-*.whl"))
    if result.returncode != 0 or not wheels:
        raise RuntimeError(f"building the wheel failed: {(result.stdout + result.stderr).strip()[-1500:]}")
    return wheels[0]


def main(requirement: str = "deepspeed") -> int:
    import torch

    if torch.version.cuda or getattr(torch.version, "hip", None):
        _say("torch has a GPU build: DeepSpeed compiles its GPU ops on first use, as usual.")
        return 0
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        try:
            source = _source(requirement, scratch)
            version = source.name[len("deepspeed-"):-len(".tar.gz")]
            key = (f"deepspeed-{version}-cpu-ops-torch-{torch.__version__}-{sysconfig.get_platform()}-"
                   f"py{sys.version_info.major}{sys.version_info.minor}-cpu-{_cpu_signature()}")
            entry = _cache_root() / key
            wheels = sorted(entry.glob("deepspeed-*.whl")) if entry.is_dir() else []
            if not wheels:
                _say(f"building DeepSpeed {version} with its CPU ops compiled (once per machine, a few minutes)")
                wheel = _build(source, scratch / "wheel")
                entry.parent.mkdir(parents=True, exist_ok=True)
                staging = Path(tempfile.mkdtemp(dir=entry.parent, prefix=".staging-"))
                staging.chmod(0o755)
                shutil.copy2(wheel, staging / wheel.name)
                try:
                    staging.rename(entry)  # whole or absent: another build that finished first wins
                except OSError:
                    shutil.rmtree(staging, ignore_errors=True)
                wheels = sorted(entry.glob("deepspeed-*.whl"))
            installed = _pip("install", "-q", "--no-deps", "--force-reinstall", str(wheels[0]))
            if installed.returncode != 0:
                raise RuntimeError(f"installing {wheels[0].name} failed: {installed.stderr.strip()[-500:]}")
            _say(f"installed {wheels[0].name} from {entry}")
        except Exception as error:  # noqa: BLE001 - the plain install that follows still works: say why, go on
            _say(f"no prebuilt CPU ops ({error}); DeepSpeed will compile them on first use instead.")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
