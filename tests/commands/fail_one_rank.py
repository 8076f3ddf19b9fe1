"""Run with `hasten launch -n 2`: rank 1 raises before joining the process group, so rank 0 waits in
init_process_group's rendezvous barrier (a wait no timeout would end for 30 minutes). The launcher must end
the whole job within seconds, with rank 1's traceback in its output."""
import os

if os.environ["RANK"] == "1":
    def load_batch():
        raise ValueError("deliberate failure on rank 1")

    load_batch()

from hasten.state import PartialState  # noqa: E402

state = PartialState()  # rank 0 blocks here: rank 1 never arrives
state.wait_for_everyone()
print("rank 0 passed the barrier: the failure was not noticed", flush=True)
