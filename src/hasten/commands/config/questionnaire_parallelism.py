"""``hasten config``'s questions about N-D parallelism; the answers become the ``parallelism_config`` section
(``parallelism_config_<size>`` keys, which ``hasten launch`` checks against the number of processes and passes
to ``ParallelismConfig``). The sizes asked always multiply to the number of processes: the last one is derived.

Context and sequence parallelism are not asked (hasten does not train with them yet); pipeline parallelism needs
a function that cuts the model into stages, so it is set in code (``ParallelismConfig(pp_size=...)``).
"""
from __future__ import annotations

from .questions import ask_bool, ask_int

__all__ = ["ask_model_parallel", "ask_fsdp_parallelism", "PREFIX"]

PREFIX = "parallelism_config_"


def _divides(total: int, what: str):
    def check(value: int) -> None:
        if total % value:
            raise ValueError(f"{value} does not divide {total} ({what}): choose one of "
                             f"{', '.join(str(d) for d in range(1, total + 1) if total % d == 0)}.")

    return check


def _sizes(dp_replicate: int, dp_shard: int, tp: int) -> dict:
    return {PREFIX + "dp_replicate_size": dp_replicate, PREFIX + "dp_shard_size": dp_shard, PREFIX + "tp_size": tp}


def _tp_size(num_processes: int, default: int) -> int:
    return ask_int(f"Tensor-parallel size (processes that split each layer; it must divide {num_processes})?",
                   default if num_processes % default == 0 else 1, minimum=1, maximum=num_processes,
                   check=_divides(num_processes, "the number of processes"))


def ask_model_parallel(num_processes: int) -> dict:
    """Tensor parallelism, the rest of the processes sharding (FSDP) and/or replicating (DDP) the model."""
    tp = _tp_size(num_processes, 2)
    rest = num_processes // tp
    if rest == 1:
        return _sizes(1, 1, tp)
    print(f"  {rest} tensor-parallel groups train on different data.")
    shard = ask_int(f"How many of them shard the model between them (FSDP, dp_shard_size; it must divide {rest}; "
                    "the others are replicas)?", 1, minimum=1, maximum=rest,
                    check=_divides(rest, "the data-parallel groups"))
    print(f"  dp_replicate_size = {rest // shard}, dp_shard_size = {shard}, tp_size = {tp}.")
    return _sizes(rest // shard, shard, tp)


def ask_fsdp_parallelism(num_processes: int) -> dict:
    """FSDP2 combined with tensor parallelism or replicas of the sharded model (HSDP); empty when not wanted."""
    if num_processes == 1 or not ask_bool("Combine FSDP with tensor parallelism or with replicas of the sharded "
                                          "model (HSDP)?", False):
        return {}
    tp = _tp_size(num_processes, 1)
    rest = num_processes // tp
    replicate = 1
    if rest > 1:
        replicate = ask_int(f"Into how many replicas should the other {rest} ways be split (dp_replicate_size; "
                            f"each replica shards the model over {rest} / replicas processes)?", 1, minimum=1,
                            maximum=rest, check=_divides(rest, "the data-parallel ways"))
    print(f"  dp_replicate_size = {replicate}, dp_shard_size = {rest // replicate}, tp_size = {tp}.")
    return _sizes(replicate, rest // replicate, tp)
