"""`hasten estimate-memory`: the parser, the figures (checked against shapes) and the errors."""
from __future__ import annotations

import argparse
import json
import sys
import types

import pytest
import torch
import torch.nn as nn

from hasten.commands import estimate
from hasten.commands.errors import CommandError

MODEL_SOURCE = '''
import torch
import torch.nn as nn

class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)

class Net(nn.Module):
    _no_split_modules = ["Block"]

    def __init__(self, d=8, layers=2, vocab=100):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList([Block(d) for _ in range(layers)])
        self.register_buffer("positions", torch.arange(16))

def make(d=8):
    return Net(d=d, layers=1)

def not_a_model():
    return 3
'''


def _parse(*argv):
    parser = argparse.ArgumentParser()
    estimate.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["estimate-memory", *argv])


@pytest.fixture
def model_file(tmp_path, monkeypatch):
    path = tmp_path / "netdef.py"
    path.write_text(MODEL_SOURCE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return path


def _run_json(capsys, *argv):
    assert estimate.run(_parse(*argv, "--json")) == 0
    return json.loads(capsys.readouterr().out)


def _expected_sizes(d, layers, vocab):
    block = (d * 4 * d + 4 * d) + (4 * d * d + d)
    params = vocab * d + layers * block
    return params, block, vocab * d


def test_figures_follow_from_the_shapes(model_file, capsys):
    report = _run_json(capsys, f"{model_file}:Net", "--arg", "d=16", "-a", "layers=3")
    params, block, embed = _expected_sizes(16, 3, 100)
    assert report["parameters"] == params
    rows = {row["dtype"]: row for row in report["rows"]}
    assert list(rows) == ["float32", "float16", "int8", "int4"]
    buffer_bytes = 16 * 8  # int64 positions keep their size in every row
    assert rows["float32"]["total_size"] == params * 4 + buffer_bytes
    assert rows["float16"]["total_size"] == params * 2 + buffer_bytes
    # int8 / int4: what load_and_quantize_model allocates; Net's last child ("blocks") counts as its output head,
    # so it stays unquantized, in float16 (tests/quantization/test_quantization_memory.py checks a model with a head)
    assert rows["int8"]["total_size"] == rows["int4"]["total_size"] == params * 2 + buffer_bytes
    # the largest layer counts whole Blocks (the model's _no_split_modules) against the embedding
    assert rows["float32"]["largest_layer"] == max(block, embed) * 4
    assert rows["float32"]["training_adam"] == params * 16
    assert rows["float16"]["training_adam"] == params * 16  # mixed precision keeps fp32 weights and moments
    assert rows["int8"]["training_adam"] is None


def test_module_path_kwargs_json_and_factories(model_file, capsys):
    report = _run_json(capsys, "netdef:Net", "--kwargs", '{"d": 4, "vocab": 10}', "--dtypes", "bfloat16")
    params, _, _ = _expected_sizes(4, 2, 10)
    assert report["rows"][0]["dtype"] == "bfloat16" and report["rows"][0]["total_size"] == params * 2 + 128
    report = _run_json(capsys, "netdef:make", "--no-split", "Linear")
    assert report["parameters"] == _expected_sizes(8, 1, 100)[0]


def test_local_config_file(model_file, tmp_path, capsys):
    config = tmp_path / "model.json"
    config.write_text(json.dumps({"model": "netdef:Net", "kwargs": {"d": 4, "layers": 1, "vocab": 10}}))
    report = _run_json(capsys, str(config), "-a", "layers=2", "--trust_remote_code")  # command-line arguments win
    assert report["parameters"] == _expected_sizes(4, 2, 10)[0]


def test_table_output(model_file, capsys):
    assert estimate.run(_parse("netdef:Net")) == 0
    out = capsys.readouterr().out
    assert "Largest layer" in out and "Training with Adam" in out and "float32" in out and "N/A" in out


def test_transformers_configs_are_built_on_meta(tmp_path, monkeypatch, capsys):
    """A Transformers config.json, with a stand-in `transformers` module (no download, no real install needed)."""
    fake = types.ModuleType("transformers")

    class AutoConfig:
        @staticmethod
        def from_pretrained(folder, local_files_only, **kwargs):
            assert local_files_only
            return types.SimpleNamespace(hidden=kwargs.get("hidden", 6))

    class TinyForCausalLM(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.proj = nn.Linear(config.hidden, config.hidden)

        @classmethod
        def _from_config(cls, config):
            return cls(config)

    fake.AutoConfig, fake.TinyForCausalLM = AutoConfig, TinyForCausalLM
    monkeypatch.setitem(sys.modules, "transformers", fake)
    monkeypatch.setattr("hasten.core.imports.require_extra", lambda module, feature=None: fake)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["TinyForCausalLM"], "model_type": "tiny"}))
    report = _run_json(capsys, str(tmp_path))
    assert report["parameters"] == 6 * 6 + 6


def test_transformers_config_without_transformers_names_the_package(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    from hasten.core import imports

    monkeypatch.setattr(imports, "_found", lambda module: False)
    with pytest.raises(CommandError, match="pip install transformers"):
        estimate.run(_parse(str(tmp_path)))


@pytest.mark.parametrize("argv, message", [
    (["no:colon:spec"], "Cannot import"),
    (["missing_module_xyz:Net"], "Cannot import"),
    (["netdef:Nope"], "no attribute 'Nope'"),
    (["netdef:not_a_model"], "not a torch.nn.Module"),
    (["netdef:Net", "--kwargs", "{bad"], "not valid JSON"),
    (["netdef:Net", "--kwargs", "[1]"], "JSON object"),
    (["netdef:Net", "--arg", "novalue"], "NAME=VALUE"),
    (["netdef:Net", "--arg", "wrong=1"], "failed"),
    (["nothere.py:Net"], "does not exist"),
])
def test_bad_input_is_explained(model_file, argv, message):
    with pytest.raises(CommandError, match=message):
        estimate.run(_parse(*argv))


def test_human_sizes():
    assert estimate.human_bytes(512) == "512 B"
    assert estimate.human_bytes(1536) == "1.50 KiB"
    assert estimate.human_bytes(3 * 2**30) == "3.00 GiB"
    assert estimate.human_bytes(None) == "N/A"


def test_cli_entry_point(model_file, capsys):
    cli = pytest.importorskip("hasten.commands.cli")
    assert cli.main(["estimate-memory", "netdef:Net", "--json", "--dtypes", "float32"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"][0]["dtype"] == "float32"
    assert cli.main(["estimate-memory", "missing_module_xyz:Net"]) == 2


# ------------------------------------------------------------------ Hub model ids (as Accelerate takes them)
def test_hub_ids_are_told_apart_from_hasten_specs(model_file):
    for name in ("bert-base-cased", "org/model-name", "org/model.v2", "gpt2"):
        assert estimate._looks_like_hub_id(name), name
    for name in ("netdef:Net", "path/to/file.py:Net", "./folder", "/abs/config.json", "a/b/c", "config.json"):
        assert not estimate._looks_like_hub_id(name), name


def _hub(monkeypatch, info):
    monkeypatch.setattr(estimate, "verify_on_hub", lambda repo, token=None: info)


def test_a_gated_or_missing_hub_model_raises_the_hubs_errors(monkeypatch):
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    _hub(monkeypatch, "gated")
    with pytest.raises(GatedRepoError, match="is gated"):
        estimate.run(_parse("meta-llama/Llama-2-7b-hf"))
    _hub(monkeypatch, "repo")
    with pytest.raises(RepositoryNotFoundError, match="does not exist on the Hub") as caught:
        estimate.run(_parse("somebrokenname"))
    assert isinstance(caught.value, OSError)


def test_hub_metadata_decides_the_library_and_remote_code_needs_the_flag(monkeypatch):
    _hub(monkeypatch, types.SimpleNamespace(library_name=None, config={}))
    with pytest.raises(ValueError, match="--library_name"):
        estimate.run(_parse("org/no-metadata"))
    _hub(monkeypatch, types.SimpleNamespace(library_name="transformers", config={"auto_map": {"AutoModel": "m.M"}}))
    with pytest.raises(ValueError, match="--trust_remote_code"):
        estimate.run(_parse("org/custom-code"))


def test_a_hub_transformers_model_is_built_from_its_config_alone(monkeypatch, capsys):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_embd=16, n_layer=2, n_head=2, vocab_size=50, n_positions=32)
    asked = []

    def from_pretrained(name, **kwargs):
        asked.append((name, kwargs.get("token"), kwargs.get("trust_remote_code")))
        return config

    _hub(monkeypatch, types.SimpleNamespace(library_name="transformers", config={}))
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", from_pretrained)
    assert estimate.run(_parse("org/tiny-gpt2", "--json", "--dtypes", "float32", "--access_token", "tok")) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["parameters"] == sum(p.numel() for p in transformers.GPT2Model(config).parameters())
    assert asked == [("org/tiny-gpt2", "tok", False)]


def test_an_unreachable_hub_is_one_clear_line(monkeypatch):
    def offline(repo, token=None):
        raise ConnectionError("Name or service not known")

    monkeypatch.setattr(estimate, "verify_on_hub", offline)
    with pytest.raises(CommandError, match="looked up as a Hugging Face Hub model.*could not be reached"):
        estimate.run(_parse("bert-base-cased"))


# ------------------------------------------------------------------ every row in its own dtype (issue 39)
LLAMA_3_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
              "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
              "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192,
              "rope_theta": 500000.0, "tie_word_embeddings": False}
# the dtype entries a config.json can carry: Transformers 5 writes "dtype", older releases "torch_dtype"
CONFIG_DTYPES = [{"torch_dtype": "bfloat16"}, {"torch_dtype": "float32"}, {"torch_dtype": "float16"}, {},
                 {"torch_dtype": "auto"}, {"dtype": "bfloat16"}, {"dtype": "float16"}, {"dtype": "auto"}]
ALL_DTYPES = ["float32", "float16", "bfloat16", "int8", "int4"]


def _llama_parameters(hidden=4096, inter=14336, layers=32, heads=32, kv_heads=8, vocab=128256):
    """Llama's parameter count from its shapes: embedding and untied head, per layer q/k/v/o, the gated MLP and
    two norms, and the final norm."""
    kv = kv_heads * hidden // heads
    layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * inter + 2 * hidden
    return 2 * vocab * hidden + layers * layer + hidden


def _llama_folder(folder, entry):
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**LLAMA_3_8B, **entry}))
    return folder


@pytest.fixture(scope="module")
def float32_llama_rows(tmp_path_factory):
    pytest.importorskip("transformers")
    folder = _llama_folder(tmp_path_factory.mktemp("llama-fp32"), {"torch_dtype": "float32"})
    return {row["dtype"]: row for row in estimate.estimate(estimate.create_empty_model(str(folder)), ALL_DTYPES)}


@pytest.mark.parametrize("entry", CONFIG_DTYPES, ids=lambda entry: "-".join(map(str, entry.items())) or "absent")
def test_rows_convert_whatever_dtype_the_config_builds_in(tmp_path, entry, float32_llama_rows):
    """A Llama-3-8B-sized config: each row stores every floating tensor in that row's dtype, so the config's
    torch_dtype / dtype (bfloat16 before: float32 printed the bfloat16 size) changes no figure."""
    model = estimate.create_empty_model(str(_llama_folder(tmp_path / "llama", entry)))
    params = _llama_parameters()
    assert params == 8_030_261_248 == estimate._count(model)
    floating_buffers = sum(b.numel() for b in model.buffers() if b.is_floating_point())  # rotary frequencies
    assert floating_buffers == sum(b.numel() for b in model.buffers())
    rows = {row["dtype"]: row for row in estimate.estimate(model, ALL_DTYPES)}
    assert rows["float32"]["total_size"] == 4 * (params + floating_buffers)  # 29.92 GiB
    assert abs(rows["float32"]["total_size"] / 2**30 - 29.92) < 0.005
    assert rows["float16"]["total_size"] == rows["bfloat16"]["total_size"] == rows["float32"]["total_size"] / 2
    embedding = 128256 * 4096  # the largest layer: the embedding (= the untied head), not a whole decoder layer
    assert rows["float32"]["largest_layer"] == 4 * embedding
    assert rows["float16"]["largest_layer"] == rows["bfloat16"]["largest_layer"] == 2 * embedding
    for name in ("float32", "float16", "bfloat16"):
        assert rows[name]["training_adam"] == 16 * params
    # int8 / int4 (bitsandbytes' layout, the rest in float16) do not depend on the built dtype either
    for name in ("int8", "int4"):
        assert rows[name] == float32_llama_rows[name]
    assert rows == float32_llama_rows


def test_int8_row_of_the_llama_config_from_its_shapes(float32_llama_rows):
    """Linear weights in int8 plus one float32 scale per output row; embedding, head, norms and buffers in
    float16."""
    hidden, inter, kv, layers, vocab = 4096, 14336, 1024, 32, 128256
    linear = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * inter
    scales = 4 * (hidden + kv + kv + hidden + inter + inter + hidden)
    rest = 2 * (2 * vocab * hidden + (2 * layers + 1) * hidden + 128)
    assert float32_llama_rows["int8"]["total_size"] == layers * (linear + scales) + rest


def test_the_table_of_a_bfloat16_config(tmp_path, capsys):
    pytest.importorskip("transformers")
    assert estimate.run(_parse(str(_llama_folder(tmp_path / "llama", {"torch_dtype": "bfloat16"})))) == 0
    lines = {line.split("|")[1].strip(): line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")}
    assert "29.92 GiB" in lines["float32"] and "1.96 GiB" in lines["float32"]
    assert "14.96 GiB" in lines["float16"] and "1002.00 MiB" in lines["float16"]


class _TiedNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.block = nn.Sequential(nn.Linear(4, 6), nn.LayerNorm(6))
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight  # tied: counted once
        self.register_buffer("steps", torch.zeros(3, dtype=torch.int64))
        self.register_buffer("scale", torch.ones(5, dtype=torch.float16))


@pytest.mark.parametrize("built", [torch.float32, torch.bfloat16, torch.float16])
def test_module_sizes_in_dtype_counts_elements(built):
    from hasten.big_modeling import init_empty_weights
    from hasten.big_modeling.sizes import compute_module_sizes, module_sizes_in_dtype

    with init_empty_weights(include_buffers=True):
        model = _TiedNet().to(built)
    assert model.steps.dtype == torch.int64 and model.embed.weight.dtype == built
    floating = sum(t.numel() for t in list(model.parameters()) + list(model.buffers()) if t.is_floating_point())
    assert floating == 10 * 4 + (4 * 6 + 6) + (6 + 6) + 5
    for row, per_element in (("float32", 4), ("bfloat16", 2), (torch.float16, 2), ("int8", 1), ("int4", 0.5)):
        sizes = module_sizes_in_dtype(model, row)
        assert sizes[""] == floating * per_element + 3 * 8, row  # the int64 buffer keeps its 8 bytes
        assert sizes["block"] == (4 * 6 + 6 + 6 + 6) * per_element
        assert sizes["embed.weight"] == 40 * per_element and "head.weight" not in sizes
    # device-map planning keeps its rule: loading never makes a floating tensor bigger than it was built
    own = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    assert compute_module_sizes(model, dtype="float32")[""] == own
