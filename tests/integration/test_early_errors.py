"""Early, clear errors: what can be checked before the first forward pass is checked before it,
and a user's input error is never reported as an internal error."""

import collections
import importlib
import json
import types

import pytest
import torch
import transformers

from lens_position.cli import commands as cli
from lens_position.core.data import build_prompts, load_corpus
from lens_position.ground.errors import BadInputError, CorruptFileError, UnsupportedArchitectureError
from lens_position.models import load_model
from lens_position.models.tiny import tiny_hf_model

pipeline_run = importlib.import_module("lens_position.pipeline.runner")  # the package exports a function of that name


@pytest.fixture
def no_work(monkeypatch):
    """Fails the test if a run starts (models loaded, steps computed)."""
    monkeypatch.setattr(pipeline_run, "run", lambda *a, **k: pytest.fail("the run started"))


def run_cli(capsys, *argv):
    status = cli.main(list(argv))
    return status, capsys.readouterr().err


@pytest.mark.fault(area="command line", given="--seed -1 or a seed beyond 2**63-1",
                   happens="refused as a bad option (exit 2) naming the valid range, before any work")
@pytest.mark.parametrize("seed", ["-1", str(2**70), "1.5"])
def test_bad_seeds_are_refused_as_options(capsys, no_work, seed, tmp_path):
    with pytest.raises(SystemExit) as stop:
        cli.main(["decompose", "tiny-llama", "--seed", seed, "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert stop.value.code == cli.EXIT_USAGE and "0..2**63-1" in err and "internal error" not in err


@pytest.mark.fault(area="command line", given="--debug after the sub-command (lens-position decompose M --debug)",
                   happens="accepted like --debug before it: the error's traceback is shown")
def test_debug_is_accepted_after_the_sub_command(tmp_path):
    with pytest.raises(BadInputError, match="no such file"):
        cli.main(["decompose", str(tmp_path / "absent.gguf"), "--debug", "--out", str(tmp_path / "out")])
    assert cli.build_parser().parse_args(["decompose", "tiny-llama"]).debug is False


@pytest.mark.fault(area="command line", given="a .gguf path that does not exist",
                   happens="error (exit 1): no such file or folder, with the path (not 'unknown model')")
def test_a_missing_gguf_is_a_missing_file_not_an_unknown_model(capsys, tmp_path):
    status, err = run_cli(capsys, "decompose", str(tmp_path / "model.gguf"), "--out", str(tmp_path / "out"))
    assert status == cli.EXIT_ERROR and "no such file" in err and "unknown model" not in err


@pytest.mark.fault(area="command line", given="reproduce --bos none (BOS replacement and sink reading need BOS)",
                   happens="refused before any model is loaded (exit 1), saying to use --bos force")
def test_bos_none_with_reproduce_is_refused_before_any_work(capsys, no_work, tmp_path):
    status, err = run_cli(capsys, "reproduce", "--models", "tiny-llama", "--bos", "none", "--out", str(tmp_path))
    assert status == cli.EXIT_ERROR and "--bos force" in err


@pytest.mark.fault(area="command line", given="--N 2 for a command with position probes",
                   happens="refused before any model is loaded (exit 1): probes need at least 3 sequences")
@pytest.mark.parametrize("command", ["reproduce", "probe"])
def test_too_few_sequences_for_probes_are_refused_before_any_work(capsys, no_work, tmp_path, command):
    model = ["--models", "tiny-llama"] if command == "reproduce" else ["tiny-llama"]
    status, err = run_cli(capsys, command, *model, "--N", "2", "--out", str(tmp_path))
    assert status == cli.EXIT_ERROR and "--N 3" in err


@pytest.mark.fault(area="command line", given="a run that runs out of memory (too large N or T)",
                   happens="error (exit 1) saying to lower --N, --T or --batch-size, not 'internal error'")
def test_out_of_memory_is_an_input_error_not_an_internal_one(capsys, monkeypatch, tmp_path):
    def exhausted(*args, **kwargs):
        raise MemoryError("cannot allocate 80 GB")

    monkeypatch.setattr(pipeline_run, "run", exhausted)
    status, err = run_cli(capsys, "decompose", "tiny-llama", "--out", str(tmp_path))
    assert status == cli.EXIT_ERROR and "lower --N" in err and "internal error" not in err
    cell = types.SimpleNamespace(describe=lambda: "decompose on a model")
    failed = pipeline_run.CellsFailedError([(cell, torch.OutOfMemoryError("CUDA out of memory"))])
    assert failed.all_input_errors


@pytest.mark.fault(area="corpus", given="a corpus folder holding a file that is not UTF-8 text (binary, Latin-1)",
                   happens="refused: BadInputError naming the files (they used to be read with replacement "
                           "characters)")
def test_a_corpus_folder_with_non_utf8_files_is_refused(tmp_path, tiny_llama):
    (tmp_path / "good.txt").write_text("plain English text " * 20)
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 cr\xe8me ".encode("latin-1") * 20)
    (tmp_path / "image.md").write_bytes(bytes(range(256)))
    with pytest.raises(BadInputError, match="not UTF-8") as error:
        load_corpus(tmp_path)
    assert "latin1.txt" in str(error.value) and "image.md" in str(error.value)
    with pytest.raises(BadInputError, match="not UTF-8"):
        build_prompts(tiny_llama, corpus=tmp_path, T=8, N=2)


def _checkpoint(folder, **config_changes):
    hf_model, tokenizer = tiny_hf_model("tiny-llama")
    hf_model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    if config_changes:
        config = json.loads((folder / "config.json").read_text())
        config.update(config_changes)
        (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.fault(area="models", given="a checkpoint folder with an unknown model_type",
                   happens="UnsupportedArchitectureError naming the supported families (exit 1, not an internal "
                           "error)")
def test_an_unknown_model_type_is_an_unsupported_architecture(tmp_path, capsys):
    folder = _checkpoint(tmp_path / "ckpt", model_type="not-a-model")
    with pytest.raises(UnsupportedArchitectureError, match="Llama"):
        load_model(str(folder), cache_dir=str(tmp_path / "cache"))
    status, err = run_cli(capsys, "decompose", str(folder), "--out", str(tmp_path / "out"), "--quick")
    assert status == cli.EXIT_ERROR and "internal error" not in err


@pytest.mark.fault(area="models", given="a checkpoint folder with only config.json (no tokenizer, no weights)",
                   happens="BadInputError: the folder has no readable tokenizer / no weights")
def test_a_folder_with_only_a_config_says_what_is_missing(tmp_path):
    folder = tmp_path / "only-config"
    folder.mkdir()
    transformers.LlamaConfig(hidden_size=64, num_attention_heads=4, num_hidden_layers=1,
                             intermediate_size=128, vocab_size=259).save_pretrained(folder)
    with pytest.raises(BadInputError, match="tokenizer"):
        load_model(str(folder), cache_dir=str(tmp_path / "cache"))
    hf_model, tokenizer = tiny_hf_model("tiny-llama")
    tokenizer.save_pretrained(folder)
    with pytest.raises(BadInputError, match="no weights"):
        load_model(str(folder), cache_dir=str(tmp_path / "cache"))


@pytest.mark.fault(area="models", given="pickled .bin weights that torch refuses to unpickle (weights_only)",
                   happens="CorruptFileError saying to re-download or convert them to .safetensors")
def test_a_blocked_pickle_is_a_corrupt_file(tmp_path):
    folder = tmp_path / "pickled"
    hf_model, tokenizer = tiny_hf_model("tiny-llama")
    hf_model.config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    torch.save({"model.embed_tokens.weight": collections.Counter(a=1)}, folder / "pytorch_model.bin")
    with pytest.raises(CorruptFileError, match="safetensors"):
        load_model(str(folder), cache_dir=str(tmp_path / "cache"))


@pytest.mark.fault(area="command line", given="a model name one typo away from a known one (tiny-lama)",
                   happens="error (exit 1) naming the nearest known name ('did you mean'), in command-line words")
def test_an_unknown_model_name_gets_a_did_you_mean_in_command_line_words(capsys, no_work, tmp_path):
    status, err = run_cli(capsys, "decompose", "tiny-lama", "--out", str(tmp_path / "out"))
    assert status == cli.EXIT_ERROR and "Did you mean 'tiny-llama'?" in err
    assert "offline=False" not in err and "local files only" in err
    assert err.count("unknown model") == 1


@pytest.mark.fault(area="command line", given="--layers beyond the model's depth (--layers 40 on 3 layers)",
                   happens="error (exit 1) once, from the model's config, before any step runs, naming the range")
def test_layers_beyond_the_model_fail_once_before_any_step(capsys, tmp_path, monkeypatch):
    from lens_position.pipeline import worker

    monkeypatch.setattr(worker.ModelWorker, "run", lambda *a, **k: pytest.fail("a step ran"))
    status, err = run_cli(capsys, "decompose", "tiny-llama", "--layers", "40", "--quick", "--no-progress",
                          "--out", str(tmp_path / "out"))
    assert status == cli.EXIT_ERROR and "layer 40 does not exist" in err and "--layers 0:3" in err
    assert err.count("layer 40") == 1


@pytest.mark.fault(area="models", given="a name, a folder path or a transformers model passed where a model goes",
                   happens="TypeError naming what was passed and the route: lp.load_model(name or folder), or "
                           "save_pretrained then load_model(folder)")
def test_a_name_or_a_transformers_model_in_place_of_a_model_says_how_to_load_it(tiny_llama, tmp_path):
    from lens_position.analyses.decompose import decompose

    prompts = build_prompts(tiny_llama, T=8, N=2, source="random")
    for name in ("tiny-llama", str(tmp_path), tmp_path):
        with pytest.raises(TypeError, match=r"lp\.load_model\("):
            decompose(name, prompts)
    hf_model, _ = tiny_hf_model("tiny-llama")
    with pytest.raises(TypeError, match=r"LlamaForCausalLM: save it .*save_pretrained.*lp\.load_model\(folder\)"):
        decompose(hf_model, prompts)


@pytest.mark.fault(area="data", given="text= naming a file ('missing.txt', or a path that exists)",
                   happens="BadInputError: text= takes the text itself; pass corpus= to read a file "
                           "(it used to be tokenized as the text 'missing.txt')")
@pytest.mark.parametrize("text", ["missing.txt", "notes.md", "{tmp}/real.txt", "{tmp}"])
def test_text_that_names_a_file_is_refused_with_the_corpus_route(tiny_llama, tmp_path, text):
    (tmp_path / "real.txt").write_text("plain English text " * 100)
    text = text.replace("{tmp}", str(tmp_path))
    with pytest.raises(BadInputError, match=r"text= takes the text itself.*corpus="):
        build_prompts(tiny_llama, T=8, N=2, text=text)
    assert build_prompts(tiny_llama, T=8, N=2, text="plain English text " * 100).tokens.shape == (2, 8)
    assert build_prompts(tiny_llama, T=8, N=2, text="a.txt " * 100).tokens.shape == (2, 8)  # text with spaces is text
