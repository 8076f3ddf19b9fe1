"""Objects given to ``register_for_checkpointing``: anything with ``state_dict()`` and ``load_state_dict()``."""
from __future__ import annotations

__all__ = ["check_registrable"]


def _describe(obj) -> str:
    kind = type(obj)
    return f"{kind.__module__}.{kind.__qualname__}" if kind.__module__ != "builtins" else kind.__qualname__


def check_registrable(objects) -> list:
    """``objects`` as a list, or ValueError naming every one that lacks ``state_dict`` / ``load_state_dict``."""
    invalid = []
    for position, obj in enumerate(objects):
        missing = [name for name in ("state_dict", "load_state_dict") if not callable(getattr(obj, name, None))]
        if missing:
            invalid.append(f"argument {position} ({_describe(obj)}) has no {' and no '.join(missing)}")
    if invalid:
        raise ValueError(
            "register_for_checkpointing takes objects with state_dict() and load_state_dict() methods (their "
            "state is saved and restored with the checkpoint); " + "; ".join(invalid) + ". Wrap such a value in a "
            "small class with those two methods."
        )
    return list(objects)
