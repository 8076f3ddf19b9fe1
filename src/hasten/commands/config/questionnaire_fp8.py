"""``hasten config``'s fp8 questions, asked after ``mixed_precision: fp8``; the answers become the ``fp8_config``
section, with the keys Accelerate's questionnaire writes for torchao (``backend: AO``, ``enable_fsdp_float8_all_gather``,
``pad_inner_dim``), which ``hasten launch`` passes to the script's ``AORecipeKwargs``. TransformerEngine and MS-AMP
are planned, so torchao is the one library offered."""
from __future__ import annotations

from .questions import ask_bool

__all__ = ["ask_fp8"]


def ask_fp8() -> dict:
    """``fp8_config`` for fp8 training through torchao."""
    print("  fp8 trains through torchao (TransformerEngine and MS-AMP recipes are planned).")
    return {
        "backend": "AO",
        "enable_fsdp_float8_all_gather": ask_bool(
            "Under FSDP2, gather the sharded fp8 weights in fp8 (half the traffic of bf16)?", True),
        "pad_inner_dim": ask_bool("Pad the fp8 matrix products' inner dimension to a multiple of 16?", True),
    }
