"""Checks that a "complete" example script holds every feature of the small feature scripts beside it
(Accelerate's ``accelerate.test_utils.examples``, same names and answers).

An examples folder in Accelerate's layout has a template (``nlp_example.py`` in the folder), complete scripts
(``complete_nlp_example.py``) and one script per feature (``examples/by_feature/*.py``), each a copy of the
template with one feature added. ``compare_against_test`` finds the lines a feature script adds to the template
and returns those the complete script lacks: an empty list means the complete script is up to date. Comments and
blank lines never count, and neither do the lines that only serve the tests (the mocked-dataloader switch).
"""
from __future__ import annotations

import os
from typing import Optional

__all__ = ["get_function_contents_by_name", "clean_lines", "compare_against_test"]

# Where each section of an example script ends: the line that begins the next one.
_SECTION_ENDS = {"training_function": "def main", "main": "if __name__"}
_LOADERS_LINE = "train_dataloader, eval_dataloader = get_dataloaders(accelerator, batch_size)\n"
_TEST_SWITCH = "TESTING_MOCKED_DATALOADERS"  # the tests' switch; the line after it belongs to it


def get_function_contents_by_name(lines: list, name: str):
    """The lines of the function ``name`` (``"training_function"`` or ``"main"``) in ``lines`` (a script's
    ``readlines()``): from its ``def`` line up to the line that begins the next section (``def main`` after the
    training function, ``if __name__`` after ``main``). None when the function or its end is not found."""
    if name not in _SECTION_ENDS:
        raise ValueError(f"Incorrect function name passed: {name}, choose either 'main' or 'training_function'")
    start = next((index for index, line in enumerate(lines) if f"def {name}" in line), None)
    if start is None:
        return None
    end = next((index for index in range(start + 1, len(lines)) if _SECTION_ENDS[name] in lines[index]), None)
    return None if end is None else list(lines[start:end])


def clean_lines(lines: list) -> list:
    """``lines`` without comment lines and empty lines."""
    return [line for line in lines if line != "\n" and not line.lstrip().startswith("#")]


def _section(path, parser_only: bool) -> list:
    name = "main" if parser_only else "training_function"
    with open(path) as file:
        section = get_function_contents_by_name(file.readlines(), name)
    if section is None:
        raise ValueError(f"{path} has no {name}() section (a `def {name}` line followed by "
                         f"`{_SECTION_ENDS[name]}`): it is not an example script in Accelerate's layout.")
    return clean_lines(section)


def _added_by_feature(section: list, template: list) -> list:
    """The lines of a feature script's section that the template does not have. The section's last line closes it
    and is not read; a line with the tests' switch is dropped together with the line after it."""
    added, index, reads = [], 0, 0
    while reads < len(section) - 1 and index < len(section):
        line = section[index]
        index += 1
        reads += 1
        if _TEST_SWITCH in line:
            index += 1  # the statement the switch guards
        elif line not in template and line.lstrip() != _LOADERS_LINE:
            added.append(line)
    return added


def _added_by_complete(section: list, template: list) -> list:
    """The lines of the complete script's section that the template does not have (the tests' switch left out)."""
    return [line for line in section
            if line not in template and line.lstrip() != _LOADERS_LINE and _TEST_SWITCH not in line]


def compare_against_test(base_filename, feature_filename, parser_only: bool,
                         secondary_filename: Optional[str] = None) -> list:
    """The lines ``feature_filename`` adds to the folder's template ``nlp_example.py`` (read from the current
    folder) that ``base_filename``, a complete example, does not have; empty when it has them all.

    ``parser_only`` compares the ``main()`` sections (the argument parsers), otherwise the ``training_function()``
    sections. ``secondary_filename``: the template a complete example other than the NLP one was built from (such
    as the folder's ``cv_example.py``); lines of the NLP template that it does not have are not reported.
    """
    template_path = os.path.abspath(os.path.join("examples", "nlp_example.py"))
    template = _section(template_path, parser_only)
    missing = [line for line in _added_by_feature(_section(feature_filename, parser_only), template)
               if line not in _added_by_complete(_section(base_filename, parser_only), template)]
    if secondary_filename is not None:
        secondary = _section(secondary_filename, parser_only)
        with open(template_path) as file:
            nlp_only = [line for line in file.readlines() if line not in secondary]
        missing = [line for line in missing if line not in nlp_only]
    return missing
