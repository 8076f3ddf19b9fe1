"""Training backends behind one protocol (``base.py``): one file for one device (``single.py``) and DDP
(``ddp.py``), one folder for each sharded or model-parallel backend (``fsdp/``, ``deepspeed/``,
``model_parallel/``); ``select.py`` picks the run's.
"""
from .base import Strategy
from .ddp import DDPStrategy
from .select import requested_backend, select_strategy
from .single import SingleDeviceStrategy

__all__ = ["Strategy", "SingleDeviceStrategy", "DDPStrategy", "select_strategy", "requested_backend"]
