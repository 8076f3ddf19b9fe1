"""``hasten config``'s torch.compile questions; the answers become the ``dynamo_config`` section."""
from __future__ import annotations

from ...core.constants import TORCH_DYNAMO_MODES
from .config_utils import DYNAMO_BACKENDS
from .questions import ask_bool, ask_choice

__all__ = ["ask_dynamo"]


def ask_dynamo() -> dict:
    """``dynamo_config``; empty when the script is not to be compiled."""
    if not ask_bool("Do you wish to optimize your script with torch.compile?", False):
        return {}
    backends = [(backend.lower(), backend) for backend in DYNAMO_BACKENDS]
    dynamo = {"dynamo_backend": ask_choice("Which torch.compile backend?", backends,
                                           default=DYNAMO_BACKENDS.index("INDUCTOR"))}
    if ask_bool("Do you want to choose the mode, fullgraph and dynamic shapes (else torch.compile's defaults)?",
                False):
        dynamo["dynamo_mode"] = ask_choice("Which mode?", [(mode, mode) for mode in TORCH_DYNAMO_MODES])
        dynamo["dynamo_use_fullgraph"] = ask_bool("Compile the whole model as one graph (fullgraph)?", False)
        dynamo["dynamo_use_dynamic"] = ask_bool("Trace dynamic shapes (dynamic)?", False)
        dynamo["dynamo_use_regional_compilation"] = ask_bool("Compile repeated blocks once (regional compilation)?",
                                                             False)
    return dynamo
