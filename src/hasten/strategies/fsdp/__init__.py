"""Fully Sharded Data Parallel, in one room: the FSDP2 strategy (``fsdp2.py``, ``fully_shard``) and the FSDP1 one
(``fsdp1.py``, the wrapper module), which units are sharded and activation checkpointing (``wrapping.py``), and the
logic behind Accelerate's
``accelerate.utils.fsdp_utils`` functions (``checkpoint_files.py``: save/load of model and optimizer files;
``functions.py``: merge-weights, RAM-efficient loading, FSDP2 helpers). The plugin's options are
``hasten.config.fsdp.FullyShardedDataParallelPlugin``. Its sharded checkpoints (DCP, one file set per rank) are the
sharded format's (``checkpointing/sharded_files.py``), written and read by ``checkpointing/sharded_io.py``.
"""
