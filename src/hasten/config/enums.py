"""String-valued enums shared by configuration, state and the command line.

Member names and values match Accelerate's so that configs, environment values and user code written
for it keep working (``DistributedType.MULTI_CPU == "MULTI_CPU"``).
"""
from enum import Enum


class _StrEnum(str, Enum):
    """An enum whose members compare equal to their string values."""

    def __str__(self) -> str:
        return str(self.value)

    @classmethod
    def list(cls) -> list:
        return [member.value for member in cls]

    @classmethod
    def parse(cls, value, what: str):
        """Return the member for ``value`` (a member, or its value/name in any case), or raise a clear error."""
        if isinstance(value, cls):
            return value
        text = str(value).strip()
        for member in cls:
            if text.lower() in (str(member.value).lower(), member.name.lower()):
                return member
        raise ValueError(f"Unknown {what} {value!r}; choose one of {', '.join(map(repr, cls.list()))}.")


class _NamedStrEnum(_StrEnum):
    """A ``_StrEnum`` whose ``str()`` is ``"Class.MEMBER"``, as Accelerate's plain ``(str, Enum)`` classes print
    (scripts and libraries compare those strings); it still equals its value."""

    def __str__(self) -> str:
        return f"{type(self).__name__}.{self.name}"

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


class DistributedType(_NamedStrEnum):
    """How the processes of a run share the work."""

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    MULTI_NPU = "MULTI_NPU"
    MULTI_MLU = "MULTI_MLU"
    MULTI_SDAA = "MULTI_SDAA"
    MULTI_MUSA = "MULTI_MUSA"
    MULTI_XPU = "MULTI_XPU"
    DEEPSPEED = "DEEPSPEED"
    FSDP = "FSDP"
    XLA = "XLA"
    MEGATRON_LM = "MEGATRON_LM"
    MULTI_HPU = "MULTI_HPU"
    MULTI_NEURON = "MULTI_NEURON"


class RNGType(_StrEnum):
    """Random number generators that can be synchronised across processes."""

    TORCH = "torch"
    CUDA = "cuda"
    MLU = "mlu"
    SDAA = "sdaa"
    MUSA = "musa"
    NPU = "npu"
    XLA = "xla"
    XPU = "xpu"
    HPU = "hpu"
    NEURON = "neuron"
    GENERATOR = "generator"


class PrecisionType(_StrEnum):
    """Mixed-precision modes."""

    NO = "no"
    FP8 = "fp8"
    FP16 = "fp16"
    BF16 = "bf16"


class DynamoBackend(_StrEnum):
    """Backends accepted by ``torch.compile`` (upper-case names, as in Accelerate configs)."""

    NO = "NO"
    EAGER = "EAGER"
    AOT_EAGER = "AOT_EAGER"
    INDUCTOR = "INDUCTOR"
    AOT_TS_NVFUSER = "AOT_TS_NVFUSER"
    NVPRIMS_NVFUSER = "NVPRIMS_NVFUSER"
    CUDAGRAPHS = "CUDAGRAPHS"
    OFI = "OFI"
    FX2TRT = "FX2TRT"
    ONNXRT = "ONNXRT"
    TENSORRT = "TENSORRT"
    AOT_TORCHXLA_TRACE_ONCE = "AOT_TORCHXLA_TRACE_ONCE"
    TORCHXLA_TRACE_ONCE = "TORCHXLA_TRACE_ONCE"
    TVM = "TVM"
    HPU_BACKEND = "HPU_BACKEND"
    NEURON = "NEURON"


class ComputeEnvironment(_NamedStrEnum):
    LOCAL_MACHINE = "LOCAL_MACHINE"
    AMAZON_SAGEMAKER = "AMAZON_SAGEMAKER"


class LoggerType(_StrEnum):
    """Experiment trackers known by name."""

    ALL = "all"
    AIM = "aim"
    TENSORBOARD = "tensorboard"
    WANDB = "wandb"
    TRACKIO = "trackio"
    COMETML = "comet_ml"
    MLFLOW = "mlflow"
    CLEARML = "clearml"
    DVCLIVE = "dvclive"
    SWANLAB = "swanlab"
