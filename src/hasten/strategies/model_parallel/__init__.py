"""Model parallelism on torch's own engine, in one room: tensor parallelism on DTensor composed with FSDP2
(``strategy.py``) and its plans (``tp_plan.py``), pipeline stages and schedules (``pipeline.py``,
``pipeline_model.py``), context parallelism (``context_parallel.py``), and ``MegatronLMPlugin`` mapped onto the
same engine (``megatron.py``, ``megatron_mapping.py``, Megatron's schedules in ``megatron_scheduler.py`` and
Accelerate's Megatron-engine names in ``megatron_engine.py``).
"""
