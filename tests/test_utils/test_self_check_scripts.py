"""The packaged self-check scripts (``hasten.test_utils.test_script`` / ``test_ops`` / ``test_sync``), called as
Accelerate's test suites call them: through ``debug_launcher``, on one process and on two."""
import subprocess
import sys
import textwrap

from helpers import ROOT, one_multiprocess_job_at_a_time, clean_env

DRIVER = textwrap.dedent("""
    from hasten import debug_launcher
    from hasten.test_utils import test_ops, test_script, test_sync

    debug_launcher(test_script.main, num_processes=1)
    debug_launcher(test_sync.main, num_processes=1)
    debug_launcher(test_script.main)
    debug_launcher(test_ops.main)
""")


def test_scripts_under_debug_launcher():
    with one_multiprocess_job_at_a_time():
        result = subprocess.run([sys.executable, "-c", DRIVER], capture_output=True, text=True, timeout=300,
                                env=clean_env(), cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    for line in ("test_script OK on 1 process\n", "test_sync OK: 1 rounds on 1 processes",
                 "test_script OK on 2 processes", "test_ops OK on 2 processes"):
        assert line in result.stdout, (line, result.stdout[-3000:])


def test_scripts_are_lazy_and_named_for_accelerate():
    code = ("import sys, hasten.test_utils as t; assert 'hasten.test_utils.scripts.test_script' not in sys.modules; "
            "assert t.test_script.__name__ == 'hasten.test_utils.scripts.test_script'; "
            "from hasten.test_utils import test_sync; assert callable(test_sync.main)")
    subprocess.run([sys.executable, "-c", code], check=True, env=clean_env(), cwd=ROOT, timeout=120)


def test_a_broken_training_is_caught():
    """test_script's training check compares with plain PyTorch: an Accelerator whose backward forgets to scale
    the loss under accumulation must fail it."""
    code = textwrap.dedent("""
        from hasten.accelerator import Accelerator
        from hasten.test_utils import test_script
        original = Accelerator.backward
        Accelerator.backward = lambda self, loss, **kw: loss.backward()
        try:
            test_script.check_training_equivalence(1)
        except AssertionError as error:
            print("CAUGHT", "accumulation=2" in str(error))
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(), cwd=ROOT,
                            timeout=120)
    assert "CAUGHT True" in result.stdout, result.stdout + result.stderr
