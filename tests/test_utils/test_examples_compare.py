"""``hasten.test_utils.examples``: does a complete example script hold every feature script's additions?"""
from __future__ import annotations

import textwrap

import pytest

from hasten.test_utils.examples import clean_lines, compare_against_test, get_function_contents_by_name

TEMPLATE = """\
import torch


def training_function(config, args):
    accelerator = Accelerator()
    train_dataloader, eval_dataloader = get_dataloaders(accelerator, batch_size)
    for batch in train_dataloader:
        step(batch)
    accelerator.end_training()


def main():
    parser = argparse.ArgumentParser()
    args = parser.parse_args()
    training_function(config, args)


if __name__ == "__main__":
    main()
"""


def _script(*, training_extra=(), main_extra=()) -> str:
    """The template with lines added after the loop (training) and after the parser (main)."""
    lines = TEMPLATE.splitlines(keepends=True)
    at_training = lines.index("        step(batch)\n") + 1
    lines[at_training:at_training] = [f"    {line}\n" if line else "\n" for line in training_extra]
    at_main = lines.index("    parser = argparse.ArgumentParser()\n") + 1
    lines[at_main:at_main] = [f"    {line}\n" for line in main_extra]
    return "".join(lines)


@pytest.fixture
def examples(tmp_path, monkeypatch):
    """An examples folder in Accelerate's layout, the current folder's parent of it."""
    folder = tmp_path / "examples"
    (folder / "by_feature").mkdir(parents=True)
    (folder / "nlp_example.py").write_text(TEMPLATE)
    monkeypatch.chdir(tmp_path)

    def write(name, text):
        path = folder / name
        path.write_text(text)
        return str(path)

    return write


def test_a_complete_example_with_every_feature_line_has_nothing_missing(examples):
    feature = examples("by_feature/tracking.py", _script(training_extra=["accelerator.log(loss)"],
                                                          main_extra=["parser.add_argument('--with_tracking')"]))
    complete = examples("complete_nlp_example.py", _script(
        training_extra=["accelerator.log(loss)", "accelerator.save_state(out)"],
        main_extra=["parser.add_argument('--with_tracking')", "parser.add_argument('--output_dir')"]))
    assert compare_against_test(complete, feature, parser_only=False) == []
    assert compare_against_test(complete, feature, parser_only=True) == []


def test_the_lines_a_complete_example_lacks_are_returned_per_section(examples):
    feature = examples("by_feature/checkpointing.py", _script(
        training_extra=["# a comment is no feature", "", "accelerator.save_state(out)"],
        main_extra=["parser.add_argument('--checkpointing_steps')"]))
    complete = examples("complete_nlp_example.py", _script())
    assert compare_against_test(complete, feature, parser_only=False) == ["    accelerator.save_state(out)\n"]
    assert compare_against_test(complete, feature, parser_only=True) == [
        "    parser.add_argument('--checkpointing_steps')\n"]


def test_the_tests_mocked_loader_switch_and_its_statement_are_not_features(examples):
    feature = examples("by_feature/memory.py", _script(training_extra=[
        "if os.environ.get('TESTING_MOCKED_DATALOADERS', None) == '1':", "    config['num_epochs'] = 2",
        "train_dataloader, eval_dataloader = get_dataloaders(accelerator, batch_size)"]))
    assert compare_against_test(examples("complete_nlp_example.py", _script()), feature, parser_only=False) == []


def test_lines_of_the_nlp_template_missing_from_a_secondary_template_are_not_reported(examples):
    """A complete example built from another template (cv_example.py): a feature line that is one of the NLP
    template's own lines, which the other template's section lacks, is no feature to look for."""
    secondary = examples("cv_example.py", _script())
    feature = examples("by_feature/parsing.py", _script(training_extra=["args = parser.parse_args()"]))
    complete = examples("complete_cv_example.py", _script())
    assert compare_against_test(complete, feature, parser_only=False) == ["    args = parser.parse_args()\n"]
    assert compare_against_test(complete, feature, parser_only=False, secondary_filename=secondary) == []


def test_the_section_helpers_and_their_refusals(examples):
    lines = TEMPLATE.splitlines(keepends=True)
    main = get_function_contents_by_name(lines, "main")
    assert main[0] == "def main():\n" and main[-1] == "\n" and not any("__name__" in line for line in main)
    assert get_function_contents_by_name(lines, "training_function")[-1] == "\n"
    assert get_function_contents_by_name(["print(1)\n"], "main") is None
    with pytest.raises(ValueError, match="Incorrect function name passed: forward"):
        get_function_contents_by_name(lines, "forward")
    assert clean_lines(["# note\n", "\n", "    # indented note\n", "x = 1\n"]) == ["x = 1\n"]
    no_training = examples("by_feature/megatron.py", textwrap.dedent("""\
        def main():
            pass


        if __name__ == "__main__":
            main()
        """))
    with pytest.raises(ValueError, match="no training_function"):
        compare_against_test(examples("complete_nlp_example.py", TEMPLATE), no_training, parser_only=False)
