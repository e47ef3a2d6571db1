"""Rewrite a GGUF file with some tensors dropped or renamed and some header values changed, as a
damaged or hand-edited checkpoint would be (metadata and tensor bytes copied as they are)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import gguf
import numpy as np


def rewrite_gguf(source: Path, target: Path, *, keep: Callable[[str], bool] = lambda name: True,
                 rename: Mapping[str, str] | None = None, values: Mapping[str, Any] | None = None) -> Path:
    """Copy ``source`` to ``target`` keeping the tensors ``keep`` accepts, renaming those in
    ``rename`` and setting the integer header values in ``values`` (e.g. ``llama.block_count``)."""
    reader = gguf.GGUFReader(str(source))
    arch = str(bytes(reader.fields["general.architecture"].parts[-1]), "utf-8")
    writer = gguf.GGUFWriter(str(target), arch)
    values = dict(values or {})
    rename = dict(rename or {})
    for field in reader.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        value = values.pop(field.name, field.contents())
        writer.add_key_value(field.name, value, kind, sub_type=sub)
    for name, value in values.items():
        writer.add_key_value(name, value, gguf.GGUFValueType.UINT32)
    tensors = [t for t in reader.tensors if keep(t.name)]
    for tensor in tensors:
        writer.add_tensor_info(rename.get(tensor.name, tensor.name), tensor.data.shape, tensor.data.dtype,
                               tensor.data.nbytes, tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor in tensors:
        writer.write_tensor_data(np.asarray(tensor.data), tensor_endianess=reader.endianess)
    writer.close()
    return target


def first_blocks(name: str, n: int) -> bool:
    """Whether tensor ``name`` belongs outside the blocks or to one of the first ``n`` blocks."""
    if not name.startswith("blk."):
        return True
    return int(name.split(".")[1]) < n
