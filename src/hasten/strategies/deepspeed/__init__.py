"""DeepSpeed ZeRO, in one room: the strategy that builds one engine per ``prepare`` (``strategy.py``), the DeepSpeed
config with every ``"auto"`` filled from the run (``auto_config.py``), full model and optimizer states through
DeepSpeed's tensor fragments (``engine_state.py``), the engines' checkpoints inside hasten's transaction
(``checkpoint_io.py``; the format itself, read without an engine by any strategy, is
``checkpointing/deepspeed_files.py``), and the
objects a DeepSpeed run hands the script (``wrappers.py``: prepared optimizer / scheduler, ``DummyOptim``,
``GatheredParameters``). The plugin's options are ``hasten.config.deepspeed.DeepSpeedPlugin``; deepspeed itself is
imported only when an engine is built.
"""
