"""Asking questions in a terminal for ``hasten config``: free answers, menus, and their conversions."""
from __future__ import annotations

import argparse

from ...config.enums import ComputeEnvironment, DistributedType, DynamoBackend, PrecisionType
from ..flags import OneSpellingHelpFormatter

__all__ = ["DYNAMO_BACKENDS", "SubcommandHelpFormatter"]

DYNAMO_BACKENDS = [backend for backend in DynamoBackend.list() if backend != "NO"]


def _ask_field(input_text, convert_value=None, default=None, error_message=None):
    """Ask until the answer converts; an empty answer is ``default`` when there is one."""
    while True:
        answer = input(input_text)
        if default is not None and len(answer) == 0:
            return default
        try:
            return convert_value(answer) if convert_value is not None else answer
        except Exception as error:  # any conversion failure: say so and ask again
            print(error_message if error_message is not None else f"Cannot use {answer!r}: {error}")


def _ask_options(input_text, options=[], convert_value=None, default=0):  # noqa: B006 - Accelerate's signature
    """A menu of ``options``; the index chosen, through ``convert_value`` when given."""
    from ..menu import BulletMenu

    result = BulletMenu(input_text, options).run(default_choice=default)
    return convert_value(result) if convert_value is not None else result


def _convert_compute_environment(value):
    return ComputeEnvironment(["LOCAL_MACHINE", "AMAZON_SAGEMAKER"][int(value)])


# the machine types hasten's questionnaire offers, in menu order
DISTRIBUTED_CHOICES = (("No distributed training", DistributedType.NO), ("multi-CPU", DistributedType.MULTI_CPU),
                       ("multi-GPU", DistributedType.MULTI_GPU), ("multi-XPU", DistributedType.MULTI_XPU))


def _convert_distributed_mode(value):
    return DISTRIBUTED_CHOICES[int(value)][1]


def _convert_dynamo_backend(value):
    return DynamoBackend(DYNAMO_BACKENDS[int(value)]).value


def _convert_mixed_precision(value):
    return PrecisionType(["no", "fp16", "bf16", "fp8"][int(value)])


def _convert_yes_no_to_bool(value):
    return {"yes": True, "y": True, "no": False, "n": False}[value.strip().lower()]


class SubcommandHelpFormatter(OneSpellingHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Help for ``hasten config default|update``: the usage line without the parent's ``<command> [<args>]``."""

    def _format_usage(self, usage, actions, groups, prefix):
        return super()._format_usage(usage, actions, groups, prefix).replace("<command> [<args>] ", "")
