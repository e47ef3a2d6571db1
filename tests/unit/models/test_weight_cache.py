"""The weight cache verifies everything an entry holds, rebuilds what fails, and stays whole under
concurrent and killed writers."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from lens_position.models import cache as weight_cache
from lens_position.models import load_model, source_hash
from lens_position.models.tiny import tiny_hf_model

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture()
def checkpoint(tmp_path) -> Path:
    """tiny-qwen2 saved as a local Hugging Face checkpoint folder (goes through the cache)."""
    hf_model, tokenizer = tiny_hf_model("tiny-qwen2")
    hf_model.save_pretrained(tmp_path / "qwen2")
    tokenizer.save_pretrained(tmp_path / "qwen2")
    return tmp_path / "qwen2"


def only_entry(cache_dir: Path) -> Path:
    (entry,) = [p for p in cache_dir.iterdir() if p.is_dir() and not p.name.startswith(".")]
    return entry


def logits(loaded, text="where does position come from"):
    tokens = torch.tensor([loaded.tokenizer(text)["input_ids"]])
    with torch.no_grad():
        return loaded.model(tokens)


def edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


CONFIG_EDITS = {
    "rotary_base": 10.0, "eps": 0.1, "act_fn": "gelu", "n_ctx": 64, "dtype": "float16",
    "n_heads": 8,  # structural: used to make every later load fail with a raw error
}


@pytest.mark.fault(area="weight cache", given="an edited field of a cached entry's hooked config (rotary_base, eps, "
                                              "act_fn, n_ctx, dtype, or the structural n_heads)",
                   happens="detected by the config's hash: the entry is rebuilt from the source with a warning, "
                           "and the model equals a fresh conversion")
@pytest.mark.parametrize("field", sorted(CONFIG_EDITS))
def test_an_edited_hooked_config_is_detected_and_rebuilt(checkpoint, tmp_path, caplog, field):
    cache_dir = tmp_path / "cache"
    fresh = load_model(str(checkpoint), cache_dir=str(cache_dir))
    edit_json(only_entry(cache_dir) / "hooked_config.json", **{field: CONFIG_EDITS[field]})
    with caplog.at_level("WARNING"):
        rebuilt = load_model(str(checkpoint), cache_dir=str(cache_dir))
    assert "rebuilding" in caplog.text and not rebuilt.spec.extra["from_cache"]
    assert rebuilt.model.cfg.to_dict()[field] == fresh.model.cfg.to_dict()[field]
    assert torch.equal(logits(rebuilt), logits(fresh))
    assert load_model(str(checkpoint), cache_dir=str(cache_dir)).spec.extra["from_cache"]


@pytest.mark.fault(area="weight cache", given="an edited tokenizer file of a cached entry (e.g. its BOS token)",
                   happens="detected by the tokenizer files' hash: the entry is rebuilt, BOS is the source's")
def test_an_edited_tokenizer_bos_is_detected_and_rebuilt(checkpoint, tmp_path, caplog):
    cache_dir = tmp_path / "cache"
    fresh = load_model(str(checkpoint), cache_dir=str(cache_dir))
    edit_json(only_entry(cache_dir) / "tokenizer" / "tokenizer_config.json", bos_token="<eos>")
    with caplog.at_level("WARNING"):
        rebuilt = load_model(str(checkpoint), cache_dir=str(cache_dir))
    assert "rebuilding" in caplog.text
    assert rebuilt.tokenizer.bos_token_id == fresh.tokenizer.bos_token_id == rebuilt.spec.bos_token_id


def test_a_consistently_edited_entry_that_no_longer_fits_its_weights_is_rebuilt(checkpoint, tmp_path, caplog):
    """Second line of defence: config and recorded hash edited together (n_heads 4 -> 8)."""
    cache_dir = tmp_path / "cache"
    load_model(str(checkpoint), cache_dir=str(cache_dir))
    entry = only_entry(cache_dir)
    edit_json(entry / "hooked_config.json", n_heads=8)
    config = json.loads((entry / "hooked_config.json").read_text())
    edit_json(entry / "meta.json", config_sha256=weight_cache._config_sha256(config))
    with caplog.at_level("WARNING"):
        rebuilt = load_model(str(checkpoint), cache_dir=str(cache_dir))
    assert "does not make a model" in caplog.text and rebuilt.spec.n_heads == 4


@pytest.mark.fault(area="weight cache", given="a cached entry whose meta.json lost a hash (weights, config or "
                                              "tokenizer), e.g. removed by hand to make an edit pass",
                   happens="rebuilt from the source with a warning; an entry is never trusted without its hashes")
@pytest.mark.parametrize("key", ["weights_sha256", "config_sha256", "tokenizer_sha256"])
def test_an_entry_without_its_hashes_is_rebuilt(checkpoint, tmp_path, caplog, key):
    cache_dir = tmp_path / "cache"
    fresh = load_model(str(checkpoint), cache_dir=str(cache_dir))
    entry = only_entry(cache_dir)
    meta = json.loads((entry / "meta.json").read_text())
    (entry / "meta.json").write_text(json.dumps({k: v for k, v in meta.items() if k != key}))
    edit_json(entry / "hooked_config.json", rotary_base=10.0)
    with caplog.at_level("WARNING"):
        rebuilt = load_model(str(checkpoint), cache_dir=str(cache_dir))
    assert f"lacks {key}" in caplog.text and not rebuilt.spec.extra["from_cache"]
    assert rebuilt.model.cfg.rotary_base == fresh.model.cfg.rotary_base


@pytest.mark.fault(area="weight cache", given="a checkpoint rewritten in place with other weights of the same "
                                              "size, its modification time set back",
                   happens="detected (the cache is keyed by the content's sha256): the new weights are converted "
                           "and analysed, never the cached old ones")
def test_a_rewrite_with_the_same_size_and_mtime_is_detected(checkpoint, tmp_path):
    cache_dir = tmp_path / "cache"
    first = load_model(str(checkpoint), cache_dir=str(cache_dir))
    weights = checkpoint / "model.safetensors"
    stat = weights.stat()
    state = load_file(weights)
    state["model.norm.weight"] = state["model.norm.weight"] * 2
    save_file(state, weights, metadata={"format": "pt"})
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert weights.stat().st_size == stat.st_size and weights.stat().st_mtime_ns == stat.st_mtime_ns
    second = load_model(str(checkpoint), cache_dir=str(cache_dir))
    assert not second.spec.extra["from_cache"]
    assert second.spec.weights_sha256 != first.spec.weights_sha256
    assert torch.equal(second.model.ln_final.w, first.model.ln_final.w * 2)


def test_an_entry_of_an_earlier_cache_format_for_the_same_source_is_removed(checkpoint, tmp_path):
    cache_dir = tmp_path / "cache"
    load_model(str(checkpoint), cache_dir=str(cache_dir))
    earlier = cache_dir / "0123456789abcdef01234567"
    os.replace(only_entry(cache_dir), earlier)
    edit_json(earlier / "meta.json", format=weight_cache.CACHE_FORMAT - 1)
    other_versions = cache_dir / "fedcba9876543210fedcba98"
    shutil.copytree(earlier, other_versions)
    edit_json(other_versions / "meta.json", versions={"lens_position": "0.0.1"})
    assert not load_model(str(checkpoint), cache_dir=str(cache_dir)).spec.extra["from_cache"]
    assert not earlier.exists()  # never read again by this version
    assert other_versions.exists()  # another version's: its environment may still read it
    assert load_model(str(checkpoint), cache_dir=str(cache_dir)).spec.extra["from_cache"]


def test_the_content_hash_is_taken_once_while_the_files_are_unchanged(checkpoint, tmp_path, monkeypatch):
    hashed = []
    original = source_hash.content_sha256
    monkeypatch.setattr(source_hash, "content_sha256", lambda path: hashed.append(path) or original(path))
    cache_dir = tmp_path / "cache"
    for _ in range(3):
        load_model(str(checkpoint), cache_dir=str(cache_dir))
    assert len(hashed) == 1
    (checkpoint / "config.json").write_text((checkpoint / "config.json").read_text())  # same bytes, new ctime
    assert load_model(str(checkpoint), cache_dir=str(cache_dir)).spec.extra["from_cache"]
    assert len(hashed) == 2


CONCURRENT_LOAD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    start = Path(sys.argv[3])
    while not start.exists():
        time.sleep(0.01)
    from lens_position.models import load_model
    loaded = load_model(sys.argv[1], cache_dir=sys.argv[2])
    print(loaded.spec.weights_sha256)
""")


@pytest.mark.fault(area="weight cache", given="four processes loading the same new model at once",
                   happens="one builds the entry while the others wait for its lock and then read it; all get "
                           "the same weights, one entry, no temporary folders")
def test_four_concurrent_loads_of_one_folder_all_succeed_with_one_entry(checkpoint, tmp_path):
    cache_dir, start = tmp_path / "cache", tmp_path / "start"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    # Import first, then start together: the race is in the cache, not in Python's start-up.
    script = "import lens_position.models\n" + CONCURRENT_LOAD
    workers = [subprocess.Popen([sys.executable, "-c", script, str(checkpoint), str(cache_dir), str(start)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
               for _ in range(4)]
    start.touch()
    results = [worker.communicate(timeout=600) for worker in workers]
    assert [w.returncode for w in workers] == [0] * 4, [err[-2000:] for _, err in results]
    hashes = {out.strip().splitlines()[-1] for out, _ in results}
    assert len(hashes) == 1
    only_entry(cache_dir)
    assert not [p for p in cache_dir.iterdir() if ".tmp-" in p.name or ".trash-" in p.name]


@pytest.mark.fault(area="weight cache", given="a writer killed while it wrote an entry (its temporary folder left "
                                              "behind)",
                   happens="the next load of that model removes the folder (its process is gone, or it is over "
                           "an hour old without a pid)")
def test_temporary_folders_of_killed_writers_are_removed(checkpoint, tmp_path):
    cache_dir = tmp_path / "cache"
    load_model(str(checkpoint), cache_dir=str(cache_dir))
    entry = only_entry(cache_dir)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(gone.stdout)
    killed = cache_dir / f".{entry.name}.tmp-{dead_pid}-0123abcd"
    old_style = cache_dir / f".{entry.name}.tmp-89abcdef"
    running = cache_dir / f".{entry.name}.tmp-{os.getpid()}-feedbeef"  # a live writer's: must stay
    for folder in (killed, old_style, running):
        folder.mkdir()
        (folder / "weights.safetensors").write_bytes(b"\0" * 1000)
    os.utime(old_style, (0, 0))
    assert load_model(str(checkpoint), cache_dir=str(cache_dir)).spec.extra["from_cache"]
    assert not killed.exists() and not old_style.exists() and running.exists()


def test_a_write_that_loses_the_rename_keeps_the_winners_entry(checkpoint, tmp_path, monkeypatch):
    """A writer that does not lock (an older lens_position) renames its entry in first."""
    cache_dir = tmp_path / "cache"
    load_model(str(checkpoint), cache_dir=str(cache_dir))
    entry = only_entry(cache_dir)
    winner = json.loads((entry / "meta.json").read_text())
    cached = weight_cache.read_entry(entry, winner["identity"], lambda folder: tiny_hf_model("tiny-qwen2")[1])
    monkeypatch.setattr(weight_cache, "discard_entry", lambda entry: None)  # the winner appears after the check
    weight_cache.write_entry(entry, winner["identity"], cached.cfg, cached.state_dict, cached.tokenizer,
                             {"model_type": "qwen2"})
    assert json.loads((entry / "meta.json").read_text()) == winner
    assert not [p for p in cache_dir.iterdir() if ".tmp-" in p.name]
