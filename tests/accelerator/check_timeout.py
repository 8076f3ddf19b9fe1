"""Run with `hasten launch -n 2`: InitProcessGroupKwargs(timeout=...) bounds every collective.

Process 1 does not join the barrier; process 0's barrier must fail after the timeout instead of waiting.
"""
import time

from hasten import Accelerator, InitProcessGroupKwargs

TIMEOUT = 3

accelerator = Accelerator(kwargs_handlers=[InitProcessGroupKwargs(timeout=TIMEOUT)])
if accelerator.process_index == 0:
    start = time.time()
    try:
        accelerator.wait_for_everyone()
    except Exception as error:  # gloo reports the timeout as a RuntimeError
        waited = time.time() - start
        print(f"collective ended after {waited:.1f} s with {type(error).__name__}", flush=True)
        assert TIMEOUT - 0.5 <= waited < TIMEOUT + 10, waited
        print("timeout honoured", flush=True)
    else:
        raise SystemExit("the barrier returned although process 1 never joined it")
else:
    time.sleep(TIMEOUT + 5)
