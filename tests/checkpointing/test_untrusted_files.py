"""Nothing runs from an untrusted file: code named in a file needs an explicit opt-in, with an error saying so."""
from __future__ import annotations

import argparse
import json
import pickle
import re
import sys
import types
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from hasten.commands import estimate
from hasten.commands.errors import CommandError
from hasten.utils import fsdp_utils
from hasten.checkpointing.safe_dcp import UnsafeCheckpointError

# Importing this file leaves a marker: the test sees whether the code ran.
MODEL_SOURCE = '''
import pathlib
import torch.nn as nn

pathlib.Path(__file__).with_name("IMPORTED").write_text("ran")

class Net(nn.Module):
    def __init__(self, d=4):
        super().__init__()
        self.proj = nn.Linear(d, d)
'''


def _parse(*argv):
    parser = argparse.ArgumentParser()
    estimate.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["estimate-memory", *argv])


def _run_json(capsys, *argv):
    assert estimate.run(_parse(*argv, "--json")) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture
def downloaded(tmp_path, monkeypatch):
    """A model folder as downloaded: config.json naming model.py:Net next to it; the user works elsewhere."""
    folder = tmp_path / "downloaded"
    folder.mkdir()
    (folder / "model.py").write_text(MODEL_SOURCE)
    (folder / "config.json").write_text(json.dumps({"model": "model.py:Net", "kwargs": {"d": 6}}))
    elsewhere = tmp_path / "work"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    return folder


@pytest.mark.parametrize("target", ["folder", "config file"])
def test_code_named_in_a_file_needs_the_flag(downloaded, target):
    path = downloaded if target == "folder" else downloaded / "config.json"
    with pytest.raises(CommandError, match="--trust_remote_code"):
        estimate.run(_parse(str(path)))
    assert not (downloaded / "IMPORTED").exists()


def test_a_shell_command_named_in_a_config_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "evil.json").write_text(json.dumps({"model": "os:system", "kwargs": {"command": "touch PWNED"}}))
    with pytest.raises(CommandError, match="names code to run.*--trust_remote_code"):
        estimate.run(_parse("evil.json"))
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize("flag", ["--trust_remote_code", "--trust-remote-code"])
def test_with_the_flag_the_folder_model_file_is_found_next_to_its_config(downloaded, capsys, flag):
    report = _run_json(capsys, str(downloaded), flag)
    assert report["parameters"] == 6 * 6 + 6
    assert (downloaded / "IMPORTED").exists()


def test_a_class_typed_on_the_command_line_needs_no_flag(downloaded, capsys):
    report = _run_json(capsys, f"{downloaded / 'model.py'}:Net", "--arg", "d=2")
    assert report["parameters"] == 2 * 2 + 2
    assert _run_json(capsys, "torch.nn:Linear", "--arg", "in_features=3", "--arg", "out_features=1")["parameters"] == 4


def test_transformers_architectures_name_only_model_classes(tmp_path, monkeypatch, capsys):
    """`architectures` picks a model class from transformers; a name of any other callable is never called."""
    called = []
    fake = types.ModuleType("transformers")

    class AutoConfig:
        @staticmethod
        def from_pretrained(folder, local_files_only, trust_remote_code, **kwargs):
            assert local_files_only and trust_remote_code is False
            return types.SimpleNamespace(hidden=3)

    class AutoModel:
        @staticmethod
        def from_config(config, trust_remote_code):
            assert trust_remote_code is False
            return nn.Linear(config.hidden, config.hidden)

    fake.AutoConfig, fake.AutoModel = AutoConfig, AutoModel
    fake.launch_rockets = lambda *args, **kwargs: called.append(args)
    monkeypatch.setitem(sys.modules, "transformers", fake)
    monkeypatch.setattr("hasten.core.imports.require_extra", lambda module, feature=None: fake)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["launch_rockets"], "model_type": "x"}))
    assert _run_json(capsys, str(tmp_path))["parameters"] == 3 * 3 + 3
    assert called == []


# ----------------------------------------------------------------------------- DCP checkpoints (merge_fsdp_weights)
class Custom:
    """An arbitrary object: restoring it from a checkpoint needs unpickling beyond plain values."""

    def __init__(self, value=1):
        self.value = value


class _WritesAFile:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):  # what a malicious .metadata would do on unpickling: call something
        return (open, (self.path, "w"))


def _dcp(folder: Path, state: dict) -> Path:
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "torch.distributed is disabled": one process writes every shard
        dcp.save(state, checkpoint_id=str(folder))
    return folder


def test_dcp_metadata_that_names_code_is_refused(tmp_path):
    shards = _dcp(tmp_path / "shards", {"model": {"w": torch.ones(2, 2)}})
    marker = tmp_path / "PWNED"
    (shards / ".metadata").write_bytes(pickle.dumps(_WritesAFile(str(marker))))
    with pytest.raises(UnsafeCheckpointError, match=r"names (io|builtins)\.open.*weights_only=False"):
        fsdp_utils.merge_fsdp_weights(str(shards), str(tmp_path / "out"))
    assert not marker.exists()


def test_dcp_objects_need_weights_only_false(tmp_path):
    shards = _dcp(tmp_path / "shards", {"model": {"w": torch.ones(2, 2)}, "extra": {"obj": Custom(3), "step": 4}})
    refused = "'extra.obj' holds an object of test_untrusted_files.Custom.*weights_only=False"
    with pytest.raises(UnsafeCheckpointError, match=refused):
        fsdp_utils.merge_fsdp_weights(str(shards), str(tmp_path / "out"), safe_serialization=False)
    fsdp_utils.merge_fsdp_weights(str(shards), str(tmp_path / "out"), safe_serialization=False, weights_only=False)
    assert (tmp_path / "out" / "pytorch_model.bin").is_file()
    # plain values (numbers, strings) and tensors need no opt-in
    plain = _dcp(tmp_path / "plain", {"model": {"w": torch.ones(2, 2), "step": 4}})
    fsdp_utils.merge_fsdp_weights(str(plain), str(tmp_path / "merged"), safe_serialization=False)
    merged = torch.load(tmp_path / "merged" / "pytorch_model.bin", weights_only=True)
    assert merged["step"] == 4 and torch.equal(merged["w"], torch.ones(2, 2))


# ----------------------------------------------------------------------------- the audit stays true
_UNSAFE = re.compile(r"pickle\.loads?\(|yaml\.load\(|yaml\.unsafe_load|FullLoader|marshal\.loads?\(|"
                     r"(?<![\w.])eval\(|(?<![\w.])exec\(|dill\.|cloudpickle\.")


# bytes another process of the same job sent through a collective (as torch's all_gather_object), not a file
_PEER_BYTES = {"collectives/object_exchange.py"}
# a launched test script unpickling the bytes it pickled itself one call before (a pickled Accelerator comes back)
_OWN_BYTES = {"test_utils/scripts/test_distributed_data_loop.py"}


def test_no_unrestricted_deserialisation_or_eval_in_the_library():
    """docs/security.md lists every place that turns file contents into objects; none may use these."""
    root = Path(estimate.__file__).resolve().parents[1]
    found = [f"{path.relative_to(root)}:{number}: {line.strip()}"
             for path in sorted(root.rglob("*.py")) if path.relative_to(root).as_posix() not in _PEER_BYTES | _OWN_BYTES
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if _UNSAFE.search(line) and not line.lstrip().startswith(("#", "def "))]
    assert found == []
