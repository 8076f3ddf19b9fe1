"""``DataLoaderStateMixin``: a loader tells ``GradientState`` where it is (last batch reached, duplicates)."""
from __future__ import annotations

from ..state import GradientState

__all__ = ["DataLoaderStateMixin"]


class DataLoaderStateMixin:
    """Progress a prepared loader reports to ``GradientState`` while it is being iterated.

    end_of_dataloader: whether the batch just yielded is the last one of the pass.
    remainder: real (not repeated by ``even_batches``) samples in the last global batch, so that
        ``gather_for_metrics`` can drop the repeats; -1 when unknown.
    """

    end_of_dataloader: bool = False
    remainder: int = -1

    @property
    def gradient_state(self) -> GradientState:
        """The run's ``GradientState`` (shared by every loader and the Accelerator), as the reference's loaders
        carry it."""
        return GradientState()

    def reset(self) -> None:
        self.end_of_dataloader = False
        self.remainder = -1

    def begin(self) -> None:
        """A pass starts: this loader becomes ``GradientState``'s active loader."""
        self.reset()
        self.remainder = self._expected_remainder()
        GradientState()._add_dataloader(self)

    def end(self) -> None:
        """The pass is over (finished or abandoned): the previous loader becomes active again."""
        state = GradientState()
        if self in state.dataloader_references:
            state._remove_dataloader(self)

    def _expected_remainder(self) -> int:
        """The remainder known before the pass starts; -1 when it is only learnt at the end."""
        return -1
