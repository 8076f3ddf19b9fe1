"""Gathering evaluation results so that every sample is counted exactly once.

With ``even_batches`` (the default) the last global batch is completed with samples repeated from the start
of the data set, so that every process gets a full batch. ``gather_for_metrics`` drops exactly those
duplicates: the prepared loader tells ``GradientState`` how many samples of its last global batch are real
(``remainder``).

Every process must take the same path (tensors, or objects): with the collective checks on (the default) a
process passing tensors while another passes other objects makes every process raise
``DistributedOperationException``, carried in the header exchange the gather does anyway.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from .collectives.operations import _gather, _gather_object, recursively_apply
from .core.aliases import NestedData
from .state import GradientState

if TYPE_CHECKING:
    from .collectives.process_view import ProcessView

__all__ = ["gather_for_metrics"]


def _all_tensors(data) -> bool:
    try:
        recursively_apply(lambda tensor: tensor, data, error_on_other_type=True)
        return True
    except TypeError:
        return False


def gather_for_metrics(input_data: NestedData, use_gather_object: bool = False,
                       processes: Optional[ProcessView] = None) -> NestedData:
    """Gather ``input_data`` from every process, without the samples ``even_batches`` duplicated.

    Tensors (nested in lists/tuples/dicts) are gathered along dim 0; anything else, or with
    ``use_gather_object=True``, goes through ``gather_object`` (lists from every process concatenated).
    Tensors may have a different first dimension on each process. ``processes``: the data-parallel processes
    to gather from (a ``ProcessView``; the whole run by default): under tensor or context parallelism the ranks
    of one model replica hold the same results, and gathering from all of them would count each sample again.
    """
    use_gather_object = use_gather_object or not _all_tensors(input_data)
    if use_gather_object:
        data = _gather_object(input_data, "gather_for_metrics", processes)
    else:
        data = _gather(input_data, "gather_for_metrics", processes)
    state = GradientState()
    if not state.end_of_dataloader or state.remainder <= 0:
        return data
    remainder = state.remainder

    def keep_real(values):
        return values[:remainder]

    return keep_real(data) if use_gather_object else recursively_apply(keep_real, data)
