"""``hasten config``'s questions for Amazon SageMaker: not available until hasten can launch there."""
from __future__ import annotations

from typing import NoReturn

from ...core.planned import not_yet_supported

__all__ = ["get_sagemaker_input"]


def get_sagemaker_input() -> NoReturn:
    """Raises ``NotYetSupportedError``: hasten cannot launch on Amazon SageMaker yet."""
    raise not_yet_supported("Launching on Amazon SageMaker",
                            "run `hasten config` for this machine and start `hasten launch` on the machines themselves")
