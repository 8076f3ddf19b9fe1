"""Configuration: enums, dataclasses, the config file and the one precedence rule that resolves them."""
from .enums import ComputeEnvironment, DistributedType, DynamoBackend, LoggerType, PrecisionType, RNGType

__all__ = ["ComputeEnvironment", "DistributedType", "DynamoBackend", "LoggerType", "PrecisionType", "RNGType"]
