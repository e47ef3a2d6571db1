"""Offline means offline, and a checkpoint's own code never runs."""

import ast
import builtins
import json
import socket
from pathlib import Path

import pytest

from lens_position.core.data import build_prompts
from lens_position.ground.errors import BadInputError, UnsupportedArchitectureError
from lens_position.models import load_model
from lens_position.models.tiny import tiny_hf_model

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def connections(monkeypatch):
    """Every attempt to look up a host or open a connection, refused and recorded. The hub libraries'
    own offline flags are switched off, as for a user who never set HF_HUB_OFFLINE."""
    import datasets.config
    import huggingface_hub.constants

    attempts = []

    def refuse(sock, address, *args, **kwargs):
        attempts.append(address)
        raise OSError("network is off in this test")

    def refuse_lookup(host, *args, **kwargs):  # DNS comes first: a sandbox without it never reaches connect
        attempts.append(host)
        raise socket.gaierror("network is off in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse_lookup)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    return attempts


@pytest.mark.fault(area="offline", given="build_prompts(..., corpus='hf:<name>:<split>') for a dataset that is not "
                                         "in the local cache, HF_HUB_OFFLINE unset",
                   happens="refused at once: BadInputError saying it is not in the local cache; no request is "
                           "sent (there used to be HEAD requests with retries)")
def test_an_hf_corpus_sends_no_request_even_without_hf_hub_offline(tiny_llama, connections):
    with pytest.raises(BadInputError, match="local cache"):
        build_prompts(tiny_llama, corpus="hf:someone/not-cached:train", T=8, N=2)
    assert connections == []


@pytest.mark.fault(area="offline", given="load_model('org/name') for a hub id, without offline=False",
                   happens="refused: BadInputError saying to pass offline=False to download; nothing connects "
                           "(reachability is not probed)")
@pytest.mark.parametrize("offline", [None, True])
def test_a_hub_id_is_downloaded_only_on_explicit_request(connections, offline):
    with pytest.raises(BadInputError, match="offline=False"):
        load_model("someone/some-model", offline=offline)
    assert connections == []


def _custom_code_checkpoint(folder: Path, model_type: str) -> Path:
    """A checkpoint whose config names its own code; the code leaves a file if it ever runs."""
    hf_model, tokenizer = tiny_hf_model("tiny-llama")
    hf_model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type=model_type, auto_map={"AutoConfig": "configuration_evil.EvilConfig",
                                                   "AutoModelForCausalLM": "modeling_evil.EvilModel"})
    (folder / "config.json").write_text(json.dumps(config))
    ran = folder / "CODE_RAN"
    code = f"open({str(ran)!r}, 'w').write('ran')\nfrom transformers import LlamaConfig as EvilConfig\n"
    (folder / "configuration_evil.py").write_text(code)
    (folder / "modeling_evil.py").write_text(code)
    return ran


@pytest.mark.fault(area="models", given="a local checkpoint folder whose config.json names custom code (auto_map)",
                   happens="refused: UnsupportedArchitectureError; its code never runs and nothing asks [y/N] "
                           "(trust_remote_code=False everywhere)")
@pytest.mark.parametrize("model_type", ["evil-model", "llama"])
def test_a_folder_with_custom_code_is_refused_and_its_code_never_runs(tmp_path, monkeypatch, model_type):
    monkeypatch.setattr(builtins, "input", lambda *a: pytest.fail("transformers asked whether to run the code"))
    ran = _custom_code_checkpoint(tmp_path / "custom", model_type)
    with pytest.raises(UnsupportedArchitectureError, match="custom Python code"):
        load_model(str(tmp_path / "custom"), cache_dir=str(tmp_path / "cache"))
    assert not ran.exists()


def test_every_transformers_load_pins_trust_remote_code_false():
    """Source guard: each from_pretrained call in the package passes trust_remote_code=False
    (directly or through NO_REMOTE_CODE), so new code cannot reopen the prompt."""
    unpinned = []
    for path in sorted((ROOT / "lens_position").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "from_pretrained":
                pinned = any(
                    (k.arg == "trust_remote_code" and isinstance(k.value, ast.Constant) and k.value.value is False)
                    or (k.arg is None and "NO_REMOTE_CODE" in ast.unparse(k.value)) for k in node.keywords)
                if not pinned:
                    unpinned.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert unpinned == []
