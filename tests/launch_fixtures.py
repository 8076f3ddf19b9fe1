"""Fixtures shared by the tests of ``hasten launch``'s planning (imported by the test modules that use them)."""
import pytest

from hasten.commands import launch as launch_command


@pytest.fixture
def script(tmp_path):
    """A training script that only prints."""
    path = tmp_path / "train.py"
    path.write_text("print('hello')\n")
    return str(path)


@pytest.fixture
def no_launch(monkeypatch):
    """Fail the test if anything would really be launched (by torchrun's agent or DeepSpeed's runner)."""
    def refuse(*args):
        raise AssertionError(f"nothing should have been launched: {args}")

    monkeypatch.setattr(launch_command, "execute", refuse)
    if hasattr(launch_command, "execute_deepspeed_runner"):
        monkeypatch.setattr(launch_command, "execute_deepspeed_runner", refuse)
    if hasattr(launch_command, "execute_mpi_runner"):
        monkeypatch.setattr(launch_command, "execute_mpi_runner", refuse)



def plan_for(argv, config=None, config_path=None):
    """The launch plan for ``hasten launch ARGV`` on a made-up machine (8 cores, no GPU, port 41234 free)."""
    from hasten.commands.launch import launch_command_parser
    from hasten.commands.launch_plan import build_plan

    args = launch_command_parser().parse_args(argv)
    return build_plan(args, config, config_path, environ={}, cpu_count=8, count_accelerators=lambda: 0,
                      find_free_port=lambda: 41234, is_port_in_use=lambda port, host: False)
