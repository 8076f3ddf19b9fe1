"""What processes do together: collectives on nested structures (``operations.py``) with the agreement checks that
turn a mismatch into an error on every rank instead of a hang (``checks.py``, ``object_exchange.py``), collectives
over a sub-group (``process_view.py``), pipeline-inference inputs (``pipeline_io.py``), and seeding / sharing RNG
states (``random.py``). Accelerate's names for them live at ``hasten.utils.operations`` and ``hasten.utils.random``.
"""
