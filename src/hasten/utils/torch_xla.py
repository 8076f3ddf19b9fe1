"""Compatibility path ``hasten.utils.torch_xla`` (Accelerate users write ``accelerate.utils.torch_xla``)."""
from ..core.xla import install_xla

__all__ = ["install_xla"]
