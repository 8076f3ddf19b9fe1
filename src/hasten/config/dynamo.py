"""``TorchDynamoPlugin``: the ``torch.compile`` settings applied to prepared models."""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Optional

from .booleans import parse_bool
from .enums import DynamoBackend
from .launch_file import config_tier, read_launch_setting
from .resolution import resolve

__all__ = ["TorchDynamoPlugin"]

_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def _flag(what: str):
    return lambda value: parse_bool(value, what)


@dataclass
class TorchDynamoPlugin:
    """How ``torch.compile`` is applied by ``prepare``.

    Unset fields come from the launcher's environment (``HASTEN_DYNAMO_BACKEND``, ``HASTEN_DYNAMO_MODE``,
    ``HASTEN_DYNAMO_USE_FULLGRAPH``, ``HASTEN_DYNAMO_USE_DYNAMIC``, ``HASTEN_DYNAMO_USE_REGIONAL_COMPILATION``,
    or their ``ACCELERATE_DYNAMO_*`` aliases),
    then the defaults (backend ``"no"`` = no compilation, mode ``"default"``). ``use_regional_compilation``
    compiles repeated blocks of one class once and reuses the compiled code, cutting cold-start time;
    ``disable`` turns compilation into a no-op (tests).
    """

    backend: Optional[DynamoBackend] = None
    mode: Optional[str] = None
    fullgraph: Optional[bool] = None
    dynamic: Optional[bool] = None
    options: Optional[dict] = None
    disable: bool = False
    use_regional_compilation: Optional[bool] = None

    def __post_init__(self):
        self.backend, _ = resolve("dynamo_backend", self.backend, argument_name="TorchDynamoPlugin(backend=...)",
                                  default=DynamoBackend.NO, parse=lambda v: DynamoBackend.parse(v, "dynamo backend"))

        def check_mode(value):
            if value not in _MODES:
                raise ValueError(f"Unknown torch.compile mode {value!r}; choose one of {', '.join(_MODES)}.")
            return value

        self.mode, _ = resolve("dynamo_mode", self.mode, argument_name="TorchDynamoPlugin(mode=...)",
                               default="default", parse=check_mode, **config_tier("dynamo_mode"))
        self.fullgraph, _ = resolve("dynamo_use_fullgraph", self.fullgraph, default=False,
                                    parse=_flag("TorchDynamoPlugin(fullgraph=...)"),
                                    argument_name="TorchDynamoPlugin(fullgraph=...)",
                                    **config_tier("dynamo_use_fullgraph"))
        self.dynamic = parse_bool(self.dynamic, "TorchDynamoPlugin(dynamic=...)", optional=True)
        self.disable = parse_bool(self.disable, "TorchDynamoPlugin(disable=...)")
        if self.dynamic is None and read_launch_setting("dynamo_use_dynamic", _flag("dynamo_use_dynamic"))[0]:
            self.dynamic = True
        self.use_regional_compilation, _ = resolve(
            "dynamo_use_regional_compilation", self.use_regional_compilation, default=False,
            parse=_flag("TorchDynamoPlugin(use_regional_compilation=...)"),
            argument_name="TorchDynamoPlugin(use_regional_compilation=...)",
            **config_tier("dynamo_use_regional_compilation"))
        if self.options is not None and not isinstance(self.options, dict):
            raise ValueError(f"options must be a dict of backend options, got {type(self.options).__name__}.")

    @property
    def enabled(self) -> bool:
        return self.backend != DynamoBackend.NO and not self.disable

    def to_dict(self) -> dict:
        """Every field, the backend as its lower-case name (as Accelerate writes it)."""
        values = copy.deepcopy(self.__dict__)
        values["backend"] = self.backend.value.lower()
        return values

    def to_kwargs(self) -> dict:
        """The fields whose value differs from a plugin made in a clean environment (no ``*_DYNAMO_*`` variables),
        as Accelerate's kwargs handlers answer; ``compile_kwargs`` gives what ``torch.compile`` takes."""
        from ..core.env_vars import clear_environment

        with clear_environment():
            defaults = type(self)().to_dict()
        return {key: value for key, value in self.to_dict().items() if defaults.get(key) != value}

    def compile_kwargs(self) -> dict:
        """Keyword arguments for ``torch.compile``."""
        kwargs = {"backend": self.backend.value.lower(), "mode": self.mode, "fullgraph": self.fullgraph,
                  "dynamic": self.dynamic, "disable": self.disable}
        if self.options:
            kwargs["options"] = self.options
            kwargs.pop("mode")  # torch.compile takes either mode or options
        return kwargs
