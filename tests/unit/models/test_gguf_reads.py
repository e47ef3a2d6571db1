"""A GGUF file's metadata is parsed once per load: one reader and one metadata parse shared by
every read transformers makes inside ``one_gguf_reader``, each caller with its own copy, and
everything put back afterwards."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import transformers.modeling_gguf_pytorch_utils as gguf_utils

from lens_position.models.gguf_reads import one_gguf_reader, plain_view_reader


def write_gguf(path, value: int) -> None:
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_uint32("test.value", value)
    writer.add_tensor("weight", np.arange(6, dtype=np.float32).reshape(2, 3))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_one_reader_per_file_inside_the_block_and_fresh_ones_outside(tmp_path):
    first, second = tmp_path / "a.gguf", tmp_path / "b.gguf"
    write_gguf(first, 1)
    write_gguf(second, 2)
    original = gguf.GGUFReader
    with one_gguf_reader():
        reader = gguf.GGUFReader(str(first))
        assert gguf.GGUFReader(first) is reader  # str or Path, the same file
        other = gguf.GGUFReader(str(second))
        assert other is not reader
        assert int(other.fields["test.value"].parts[-1][0]) == 2
        np.testing.assert_array_equal(reader.tensors[0].data, np.arange(6, dtype=np.float32).reshape(2, 3))
    assert gguf.GGUFReader is original
    assert gguf.GGUFReader(str(first)) is not reader


def test_a_rewritten_file_gets_a_new_reader(tmp_path):
    path = tmp_path / "a.gguf"
    write_gguf(path, 1)
    with one_gguf_reader():
        before = gguf.GGUFReader(str(path))
        write_gguf(path, 7)
        after = gguf.GGUFReader(str(path))
        assert after is not before
        assert int(after.fields["test.value"].parts[-1][0]) == 7


def test_metadata_is_parsed_once_and_each_caller_gets_its_own_copy(tmp_path, monkeypatch):
    path = tmp_path / "a.gguf"
    write_gguf(path, 1)
    calls = []

    def counting_load(checkpoint, return_tensors=False, model_to_load=None, torch_dtype=None):
        calls.append(return_tensors)
        return {"config": {"vocab": ["a", "b"]}, "tensors": "all" if return_tensors else None}

    monkeypatch.setattr(gguf_utils, "load_gguf_checkpoint", counting_load)
    with one_gguf_reader():
        first = gguf_utils.load_gguf_checkpoint(str(path), return_tensors=False)
        first["config"]["vocab"].append("edited by a caller")
        second = gguf_utils.load_gguf_checkpoint(str(path), return_tensors=False)
        assert second == {"config": {"vocab": ["a", "b"]}, "tensors": None}
        # the tensors are read every time: they are not kept
        assert gguf_utils.load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=None)["tensors"] == "all"
    assert calls == [False, True]
    assert gguf_utils.load_gguf_checkpoint is counting_load


def test_everything_is_put_back_when_the_read_fails(tmp_path):
    original_reader, original_load = gguf.GGUFReader, gguf_utils.load_gguf_checkpoint
    original_names = gguf.get_tensor_name_map
    with pytest.raises(RuntimeError, match="failed inside"):
        with one_gguf_reader():
            raise RuntimeError("failed inside")
    assert gguf.GGUFReader is original_reader
    assert gguf_utils.load_gguf_checkpoint is original_load
    assert gguf.get_tensor_name_map is original_names


def fields_and_tensors(reader) -> tuple[list, list]:
    """Every metadata field's parts and every tensor's name, type and bytes, as plain values."""
    fields = [(name, [part.dtype.str for part in field.parts], [part.tobytes() for part in field.parts],
               list(field.data), [int(t) for t in field.types]) for name, field in reader.fields.items()]
    tensors = [(t.name, int(t.tensor_type), t.shape.tolist(), t.data_offset, np.asarray(t.data).tobytes())
               for t in reader.tensors]
    return fields, tensors


def test_the_plain_view_reader_reads_every_field_and_tensor_as_the_plain_reader_does(tmp_path):
    path = tmp_path / "many.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_array("tokenizer.ggml.tokens", ["<s>", "a", "ĠBé", "", "日本"])
    writer.add_array("tokenizer.ggml.scores", [0.0, -1.5, 2.25, 3.0, -0.125])
    writer.add_array("tokenizer.ggml.token_type", [3, 1, 1, 1, 1])
    writer.add_uint64("test.big", 2**40 + 3)
    writer.add_float32("test.float", 0.1)
    writer.add_bool("test.flag", True)
    writer.add_string("general.name", "tiny")
    writer.add_tensor("a", np.arange(12, dtype=np.float32).reshape(3, 4))
    writer.add_tensor("b", np.arange(5, dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    plain, fast = gguf.GGUFReader(str(path)), plain_view_reader(gguf.GGUFReader)(str(path))
    assert fields_and_tensors(fast) == fields_and_tensors(plain)
    assert fast.fields["tokenizer.ggml.tokens"].contents() == ["<s>", "a", "ĠBé", "", "日本"]


@pytest.mark.slow
def test_the_plain_view_reader_reads_smollm2s_file_as_the_plain_reader_does():
    from lens_position.models.registry import lookup

    path = str(lookup("smollm2-135m").locate())
    assert fields_and_tensors(plain_view_reader(gguf.GGUFReader)(path)) == fields_and_tensors(gguf.GGUFReader(path))


def test_the_tensor_name_map_is_built_once_per_architecture_inside_the_block():
    arch = next(iter(gguf.MODEL_ARCH_NAMES))
    original = gguf.get_tensor_name_map
    with one_gguf_reader():
        first = gguf.get_tensor_name_map(arch, 2)
        assert gguf.get_tensor_name_map(arch, 2) is first
        assert gguf.get_tensor_name_map(arch, 3) is not first
        assert first.mapping == original(arch, 2).mapping
    assert gguf.get_tensor_name_map is original


@pytest.mark.fault(area="models", given="a GGUF of an encoder (BERT, T5, nomic-bert), intact",
                   happens="refused by name as another kind of model (UnsupportedArchitectureError), not called "
                           "damaged")
@pytest.mark.parametrize("arch", ["bert", "nomic-bert", "t5encoder", "jina-bert-v2"])
def test_an_encoder_gguf_is_named_as_such_not_called_damaged(tmp_path, arch):
    from lens_position.ground.errors import UnsupportedArchitectureError
    from lens_position.models.checkpoint_checks import check_gguf_sizes

    path = tmp_path / f"{arch}.gguf"
    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in (("block_count", 2), ("attention.head_count", 2), ("embedding_length", 8)):
        writer.add_uint32(f"{arch}.{key}", value)
    writer.add_tensor("token_embd.weight", np.zeros((10, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UnsupportedArchitectureError, match=f"{arch!r}, an encoder.*decoder-only"):
        check_gguf_sizes(path)
