"""HASTEN_AS_ACCELERATE / hasten.install_as_accelerate(): every `accelerate` import is hasten, in any process.

Each case runs in a fresh interpreter (the switch is process-wide, set at start-up by the hook the package installs).
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import ROOT, clean_env, python_with_site, site_packages_without

REFERENCE_VERSION = "1.15.0"


def run_python(code: str, *, switch=None, args=(), check=True, cwd=None) -> subprocess.CompletedProcess:
    env = clean_env()
    if switch is not None:
        env["HASTEN_AS_ACCELERATE"] = switch
    result = subprocess.run([sys.executable, *args, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                            env=env, cwd=cwd or ROOT, timeout=240)
    if check and result.returncode != 0:
        raise AssertionError(f"exit {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}")
    return result


IDENTITY = """
    import importlib, importlib.metadata, importlib.util, sys
    import accelerate
    import hasten
    assert accelerate.__version__ == "1.15.0", accelerate.__version__
    assert importlib.metadata.version("accelerate") == "1.15.0"
    assert importlib.util.find_spec("accelerate") is not None
    assert accelerate.Accelerator is hasten.Accelerator and accelerate.PartialState is hasten.PartialState
    import accelerate.utils, accelerate.utils.operations, accelerate.state, accelerate.utils.fsdp_utils
    from accelerate.utils.dataclasses import DistributedType
    from accelerate.data_loader import prepare_data_loader
    assert accelerate.utils is sys.modules["hasten.utils"]
    assert accelerate.utils.operations is sys.modules["hasten.utils.operations"]
    assert accelerate.state.AcceleratorState is hasten.AcceleratorState
    assert prepare_data_loader is sys.modules["hasten.data"].prepare_data_loader
    assert str(DistributedType.MULTI_CPU) == "DistributedType.MULTI_CPU" and DistributedType.MULTI_CPU == "MULTI_CPU"
    from accelerate.commands.accelerate_cli import main  # what Accelerate's `accelerate` console script imports
    assert main is sys.modules["hasten.commands.cli"].main
    try:
        import accelerate.no_such_module
    except ModuleNotFoundError:
        pass
    else:
        raise AssertionError("an unknown accelerate module imported")
    from transformers.utils import is_accelerate_available
    assert is_accelerate_available(), "transformers does not see accelerate"
    print("SWITCH OK", accelerate.__file__)
"""


def test_the_variable_makes_every_accelerate_import_hastens_module():
    result = run_python(IDENTITY, switch="1")
    assert "SWITCH OK" in result.stdout and "hasten" in result.stdout


def test_an_aliased_module_keeps_hastens_own_spec_so_its_relative_imports_do_not_warn():
    # Python's import machinery sets __spec__ on the module an alias loads; hasten.X must keep naming itself, or every
    # relative import inside it warns "__package__ != __spec__.parent" (ImportWarning) and reload() loads the alias.
    result = run_python("""
        import importlib, sys, warnings
        warnings.simplefilter("error", ImportWarning)
        import accelerate.accelerator, accelerate.utils.dataclasses, accelerate.data_loader
        import hasten.accelerator
        assert accelerate.accelerator is hasten.accelerator
        for name in ("hasten.accelerator", "hasten.utils.dataclasses", "hasten.data_loader"):
            module = sys.modules[name]
            assert module.__spec__.name == name and module.__spec__.parent == module.__package__, module.__spec__
        import torch
        accelerator = accelerate.accelerator.Accelerator()
        accelerator.prepare(torch.utils.data.DataLoader(list(range(8)), batch_size=2))  # a function-level import
        assert importlib.reload(hasten.accelerator).__name__ == "hasten.accelerator"
        print("SPECS OK")
    """, switch="1")
    assert "SPECS OK" in result.stdout


@pytest.mark.parametrize("value", ["true", "TRUE", " 1 "])
def test_true_spellings_turn_it_on(value):
    assert "on" in run_python("import accelerate, hasten; print('on' if accelerate.Accelerator is hasten.Accelerator "
                              "else 'off')", switch=value).stdout


@pytest.mark.parametrize("value", [None, "0", "false", ""])
def test_without_the_switch_the_real_accelerate_is_untouched(value):
    result = run_python("""
        import accelerate, hasten, importlib.metadata
        assert accelerate.Accelerator is not hasten.Accelerator
        print(accelerate.__file__, importlib.metadata.version("accelerate"))
    """, switch=value)
    assert "site-packages" in result.stdout and REFERENCE_VERSION in result.stdout


def test_a_wrong_value_is_an_error_naming_the_variable():
    result = run_python("import accelerate", switch="maybe", check=False)
    assert result.returncode != 0
    assert "HASTEN_AS_ACCELERATE='maybe' is not a switch value" in result.stderr
    result = run_python("import hasten", switch="yes please", check=False)
    assert result.returncode != 0 and "HASTEN_AS_ACCELERATE='yes please'" in result.stderr


def test_setting_the_variable_after_the_real_accelerate_was_imported_says_how_to_fix_it():
    result = run_python("""
        import os
        import accelerate
        os.environ["HASTEN_AS_ACCELERATE"] = "1"
        import hasten
    """, check=False)
    assert result.returncode != 0
    assert "The real accelerate is already imported in this process" in result.stderr
    assert "before Python starts" in result.stderr


def test_install_as_accelerate_in_code_and_again_is_harmless():
    run_python("""
        import sys
        import hasten
        hasten.install_as_accelerate()
        hasten.install_as_accelerate()
        from hasten.as_accelerate import is_installed_as_accelerate, uninstall_as_accelerate
        assert is_installed_as_accelerate()
        import accelerate
        assert accelerate.Accelerator is hasten.Accelerator
        uninstall_as_accelerate()
        import accelerate
        assert accelerate.Accelerator is not hasten.Accelerator and "site-packages" in accelerate.__file__
    """)


def test_a_variable_set_in_the_process_before_any_accelerate_import_counts():
    run_python("""
        import os
        os.environ["HASTEN_AS_ACCELERATE"] = "1"
        import hasten, accelerate
        assert accelerate.Accelerator is hasten.Accelerator
    """)


def test_the_switch_works_where_the_real_accelerate_is_not_installed(tmp_path):
    """A site-packages without accelerate (every other entry linked in), the start-up hook among its .pth files."""
    mirror = site_packages_without(tmp_path, "accelerate")
    probe = tmp_path / "probe.py"
    probe.write_text("import importlib.metadata as md\ntry:\n    md.version('accelerate')\n"
                     "except md.PackageNotFoundError:\n    print('NOT INSTALLED')\n")
    absent = subprocess.run([*python_with_site(mirror), str(probe)], capture_output=True, text=True, env=clean_env(),
                            cwd=ROOT, timeout=240)
    assert "NOT INSTALLED" in absent.stdout, absent.stdout + absent.stderr  # the mirror really has no accelerate
    script = tmp_path / "identity.py"
    script.write_text(textwrap.dedent(f"""
        import importlib.util
        assert importlib.util.find_spec("accelerate").origin.startswith({str(ROOT / "src")!r})
    """) + textwrap.dedent(IDENTITY))
    result = subprocess.run([*python_with_site(mirror), str(script)], capture_output=True, text=True,
                            env=clean_env(HASTEN_AS_ACCELERATE="1"), cwd=ROOT, timeout=240)
    assert "SWITCH OK" in result.stdout, result.stdout + result.stderr


def test_hasten_launch_as_accelerate_sets_the_variable_for_the_workers(tmp_path):
    from hasten.commands.launch import build_plan, launch_command_parser

    script = tmp_path / "train.py"
    script.write_text("")
    args = launch_command_parser().parse_args(["--as_accelerate", "-n", "2", str(script)])
    assert build_plan(args, None, None).env["HASTEN_AS_ACCELERATE"] == "1"
    args = launch_command_parser().parse_args(["-n", "2", str(script)])
    assert "HASTEN_AS_ACCELERATE" not in build_plan(args, None, None).env


def test_accelerates_console_script_runs_hasten(tmp_path):
    """The `accelerate` command installed by the real package (its entry point imports
    accelerate.commands.accelerate_cli) runs hasten's command line under the switch."""
    script = tmp_path / "accelerate"
    script.write_text("import sys\nfrom accelerate.commands.accelerate_cli import main\nsys.exit(main())\n")
    env = clean_env(HASTEN_AS_ACCELERATE="1")
    result = subprocess.run([sys.executable, str(script), "env"], capture_output=True, text=True, env=env, cwd=ROOT,
                            timeout=240)
    assert result.returncode == 0, result.stderr
    assert "## hasten environment" in result.stdout, result.stdout


def test_accelerates_logger_names_reach_hastens_records():
    """Code written for Accelerate listens on its logger names (``assertLogs("accelerate.utils.environment")``, a
    handler on ``logging.getLogger("accelerate")``): with the switch they are hasten's loggers at the same path."""
    result = run_python("""
        import logging, unittest
        import accelerate
        from accelerate.utils import FullyShardedDataParallelPlugin
        from accelerate.utils.environment import convert_dict_to_env_variables
        assert logging.getLogger("accelerate") is logging.getLogger("hasten")
        assert logging.getLogger("accelerate.big_modeling") is logging.getLogger("hasten.big_modeling")
        case = unittest.TestCase()
        with case.assertLogs("accelerate.utils.environment", level="WARNING"):
            convert_dict_to_env_variables({"GOOD": "1", "BAD NAME": "<x"})
        with case.assertLogs("accelerate.utils.dataclasses", level="WARNING") as captured:
            FullyShardedDataParallelPlugin(fsdp_version=2, backward_prefetch="BACKWARD_PRE")
        assert any("backward_prefetch is not supported in FSDP2" in line for line in captured.output), captured.output
        assert logging.getLogger("transformers").name == "transformers"  # other names untouched
        print("LOGGERS OK")
    """, switch="1")
    assert "LOGGERS OK" in result.stdout
    off = run_python("import logging; assert logging.getLogger('accelerate').name == 'accelerate'; print('OFF OK')")
    assert "OFF OK" in off.stdout
