"""A model's layer count and context length, read from its config alone: no weights, no
TransformerLens, no pass. The command line checks ``--layers`` and ``--T`` against them before it
loads anything (the run checks them again on the loaded model).

Where each comes from: a GGUF file's header (``<architecture>.block_count`` and
``<architecture>.context_length``, read by :func:`gguf_header_values` without parsing the
tokenizer's arrays), a checkpoint folder's ``config.json`` (``num_hidden_layers`` and the context
names of :func:`lens_position.models.spec.context_length`), a tiny model's config in code, a zoo
checkpoint's recipe. ``n_ctx`` given as a load option replaces the context.
"""

from __future__ import annotations

import json
import mmap
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lens_position.ground.errors import CorruptFileError
from lens_position.models.gguf_reads import check_gguf_header

__all__ = ["ModelShape", "gguf_header_values", "model_shape"]

# GGUF value types (gguf's GGUFValueType) and the sizes of the fixed-size ones
_STRING, _ARRAY = 8, 9
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_CONTEXT_NAMES = ("max_position_embeddings", "n_positions", "seq_length", "max_sequence_length")


@dataclass(frozen=True)
class ModelShape:
    """What a model's config says of its size: ``n_layers`` blocks, ``n_ctx`` positions."""

    n_layers: int
    n_ctx: int


def gguf_header_values(path: Path, wanted: set[str] | None = None) -> dict[str, Any]:
    """The scalar and string values of a GGUF file's header (arrays skipped, not read), by key;
    with ``wanted``, only those keys, stopping once all are found. ValueError on a file that is not
    a GGUF or ends inside its header."""
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[:4] != b"GGUF" or len(data) < 24:
            raise ValueError(f"{path} is not a GGUF file, or ends inside its header")
        (n_values,) = struct.unpack_from("<Q", data, 16)
        offset, values = 24, {}

        def string(at: int) -> tuple[str, int]:
            (length,) = struct.unpack_from("<Q", data, at)
            return bytes(data[at + 8:at + 8 + length]).decode("utf-8", "replace"), at + 8 + length

        def skip(kind: int, at: int) -> int:
            if kind in _SCALAR:
                return at + struct.calcsize(_SCALAR[kind])
            if kind == _STRING:
                return string(at)[1]
            if kind == _ARRAY:
                item, count = struct.unpack_from("<IQ", data, at)
                at += 12
                if item in _SCALAR:
                    return at + count * struct.calcsize(_SCALAR[item])
                for _ in range(count):
                    at = skip(item, at)
                return at
            raise ValueError(f"{path}: unknown GGUF value type {kind}")

        try:
            for _ in range(n_values):
                key, offset = string(offset)
                (kind,) = struct.unpack_from("<I", data, offset)
                offset += 4
                if (wanted is None or key in wanted) and (kind in _SCALAR or kind == _STRING):
                    values[key] = (struct.unpack_from(_SCALAR[kind], data, offset)[0] if kind in _SCALAR
                                   else string(offset)[0])
                    if wanted is not None and wanted <= values.keys():
                        break
                offset = skip(kind, offset)
        except struct.error as error:
            raise ValueError(f"{path} ends inside its header ({error})") from error
    return values


def _gguf_shape(path: Path) -> ModelShape | None:
    check_gguf_header(path)
    architecture = gguf_header_values(path, {"general.architecture"}).get("general.architecture")
    if not isinstance(architecture, str):
        return None
    keys = {f"{architecture}.block_count", f"{architecture}.context_length"}
    values = gguf_header_values(path, keys)
    if not keys <= values.keys():
        return None
    return ModelShape(int(values[f"{architecture}.block_count"]), int(values[f"{architecture}.context_length"]))


def _folder_shape(folder: Path) -> ModelShape | None:
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    config = config.get("text_config") or config if isinstance(config, dict) else None
    if not isinstance(config, dict) or not isinstance(config.get("num_hidden_layers"), int):
        return None
    from lens_position.models.spec import ASSUMED_CONTEXT

    context = next((config[name] for name in _CONTEXT_NAMES if isinstance(config.get(name), int)
                    and config[name] > 0), ASSUMED_CONTEXT)
    return ModelShape(int(config["num_hidden_layers"]), int(context))


def model_shape(name: str, options: Mapping[str, Any] | None = None) -> ModelShape | None:
    """The layers and context of the model ``name`` (a registry name, a zoo name, a ``.gguf`` file
    or a checkpoint folder) as ``load_model(name, **options)`` would build it, from its config
    alone; None where the config cannot be read that way (a hub id, a header cut short: the load
    then says what is wrong). CorruptFileError for a ``.gguf`` that is no GGUF file at all."""
    from lens_position.models.registry import REGISTRY, lookup

    options = dict(options or {})
    shape: ModelShape | None
    try:
        if name.startswith("zoo:"):
            from lens_position.models.zoo.store import find

            recipe = find(name).recipe
            shape = ModelShape(int(recipe.n_layers), int(recipe.context))
        elif name in REGISTRY:
            entry = lookup(name)
            options = {**entry.options, **options}
            if entry.kind == "tiny":
                from lens_position.models.tiny_configs import TINY_CONFIGS

                config = TINY_CONFIGS[name][1]
                shape = ModelShape(int(config["num_hidden_layers"]), int(config["max_position_embeddings"]))
            else:
                shape = _gguf_shape(entry.locate())
        elif Path(name).expanduser().is_file():
            shape = _gguf_shape(Path(name).expanduser())
        elif Path(name).expanduser().is_dir():
            shape = _folder_shape(Path(name).expanduser())
        else:
            return None
    except CorruptFileError:
        raise
    except (OSError, ValueError):
        return None
    if shape is not None and options.get("n_ctx") is not None:
        shape = ModelShape(shape.n_layers, int(options["n_ctx"]))
    return shape
