"""The bridge's weight cache: a GGUF file dequantised once into a Hugging Face checkpoint folder.

The bridge boots on the Hugging Face model itself, so what it can keep is that model: the first
load of a GGUF file dequantises it through transformers (SmolLM2 about 30 s, Gemma-3 about 90 s)
and saves the result with ``save_pretrained``; later loads read that folder (seconds)::

    $LENS_POSITION_CACHE/hf/<key>/            config.json, model.safetensors, tokenizer files
    $LENS_POSITION_CACHE/hf/<key>/entry.json  the source's identity, the versions, the weights' sha256

``<key>`` hashes the GGUF file's identity (path and content sha256,
:mod:`lens_position.models.source_hash`) and the versions of transformers and lens_position. A load
from an entry checks the weights' canonical sha256 against ``entry.json`` (the bridge's load hashes
them anyway); an entry that fails to read or to match is removed and rebuilt from the GGUF. Writes
are safe under concurrent loads, as the hooked backend's cache is (a lock per entry, a temporary
folder renamed whole).
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from filelock import FileLock

from lens_position.ground.errors import BadInputError
from lens_position.ground.files import resource_error
from lens_position.ground.progress import stage
from lens_position.ground.provenance import package_versions
from lens_position.models import sources
from lens_position.models.cache import cache_root, discard_entry, remove_leftovers, temporary_name
from lens_position.models.source_hash import source_identity
from lens_position.models.weights import model_weights_sha256, state_dict_sha256

log = logging.getLogger(__name__)

_FORMAT = 1


def _entry(path: Path, cache_dir: str | None) -> tuple[Path, dict[str, Any]]:
    root = cache_root(cache_dir)
    identity = {"source": source_identity(path, root), "format": _FORMAT,
                "versions": {name: version for name, version in package_versions().items()
                             if name in ("transformers", "lens_position")}}
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:24]
    return root / "hf" / key, identity


def _read(entry: Path, identity: dict[str, Any], placement: Any = None) -> tuple[Any, Any, str] | None:
    """The model, tokenizer and weights' sha256 of a complete entry whose weights are the ones it
    recorded, else None (the entry is then removed). With a ``placement`` the weights go to their
    devices as they are read (and are hashed one module at a time)."""
    try:
        record = json.loads((entry / "entry.json").read_text(encoding="utf-8"))
        if record.get("identity") != identity:
            raise ValueError("another source or versions")
        model, tokenizer = sources.read_hf_folder(entry, check=None, placement=placement)
        weights_sha256 = model_weights_sha256(model)
        if weights_sha256 != record.get("weights_sha256"):
            raise ValueError("weights that differ from the ones recorded")
    except BadInputError:  # a placement the model cannot take: the entry is sound
        raise
    except Exception as error:  # a damaged entry of any kind is rebuilt, never used
        log.warning("rebuilding the cached Hugging Face model %s (%s)", entry, error)
        discard_entry(entry)
        return None
    sources.adopt_config_bos(tokenizer, model.config)
    return model, tokenizer, weights_sha256


def _save_dequantised(model: Any, folder: Path) -> None:
    """``model.save_pretrained(folder)`` for a model read from a GGUF file: its tensors are plain floats
    already (transformers dequantised them), but it still carries the GGUF quantizer, which refuses to
    save; the quantizer and the ``quantization_config`` it left are set aside for the save only."""
    quantizer = getattr(model, "hf_quantizer", None)
    config = model.config
    quantization = config.__dict__.pop("quantization_config", None)
    model.hf_quantizer = None
    try:
        with sources.weight_bars_off():
            model.save_pretrained(folder)
    finally:
        model.hf_quantizer = quantizer
        if quantization is not None:
            config.quantization_config = quantization


def read_gguf_cached(path: Path, cache_dir: str | None = None, placement: Any = None) -> tuple[Any, Any, str]:
    """The Hugging Face model (float32, eager attention), tokenizer and weights' sha256
    (:func:`~lens_position.models.weights.state_dict_sha256`) of the GGUF file ``path``, from the cache
    when an entry is there (its weights checked against the sha256 it recorded), else dequantised
    from the file and saved to the cache. With a ``placement`` the model is read from the entry with
    its weights placed as they are read (a GGUF file is dequantised on the host once, to make the
    entry: a model too large for the host needs a Hugging Face folder, or an entry made elsewhere)."""
    entry, identity = _entry(path, cache_dir)
    if entry.is_dir():
        stage("reading the weight cache")
        found = _read(entry, identity, placement)
        if found is not None:
            return found
    if placement is not None:
        read_gguf_cached(path, cache_dir)  # makes the entry; the model it returns is dropped here
        found = _read(entry, identity, placement)
        if found is None:
            raise BadInputError(f"the weight cache under {entry.parent} could not keep the dequantised {path.name}, "
                                "which a placed load reads; free space there (or set LENS_POSITION_CACHE), or load "
                                "without device_map")
        return found
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(entry) + ".lock")
        lock.acquire()
    except OSError as error:
        raise resource_error(error, doing=f"writing the weight cache under {entry.parent}") from error
    try:
        if entry.is_dir():  # another process wrote it while this one waited
            found = _read(entry, identity)
            if found is not None:
                return found
        remove_leftovers(entry)
        model, tokenizer = sources.read_gguf(path, check=None)
        log.info("saving the dequantised %s to the weight cache (later loads read it)", path.name)
        stage("writing the weight cache")
        temporary = temporary_name(entry)
        try:
            _save_dequantised(model, temporary)
            tokenizer.save_pretrained(temporary)
            weights_sha256 = state_dict_sha256(model.state_dict())
            record = {"identity": identity, "weights_sha256": weights_sha256}
            (temporary / "entry.json").write_text(json.dumps(record, indent=1), encoding="utf-8")
            temporary.rename(entry)
        except OSError as error:  # a cache that cannot be written costs the next load its time only
            log.warning("could not cache the dequantised %s (%s)", path.name, error)
            discard_entry(temporary)
        return model, tokenizer, weights_sha256
    finally:
        lock.release()
