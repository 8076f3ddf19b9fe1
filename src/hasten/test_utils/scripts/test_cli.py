"""A script for checking a launch configuration end to end: it starts, forms the process state the launch
describes, and says what it ran on. ``hasten launch [--config_file PATH] .../test_cli.py`` (Accelerate's test suite
launches a script of this name, found with ``path_in_hasten_package("test_utils", "scripts", "test_cli.py")``)."""
import torch

from hasten.state import PartialState


def main() -> None:
    state = PartialState()
    accelerators = torch.cuda.device_count() if torch.cuda.is_available() else 0
    kind = "GPU" if accelerators else "CPU"
    if state.is_main_process:
        print(f"Successfully ran on {max(accelerators, 1) if kind == 'GPU' else state.num_processes} {kind}s "
              f"({state.num_processes} process(es), {state.distributed_type.value})", flush=True)


if __name__ == "__main__":
    main()
