"""The controlled zoo: recipes reproduce weights bit for bit, shipped checkpoints are what
their recipes say and load offline, and the C3 answer is computed from paired seeds."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pandas as pd
import pytest
import torch

from lens_position.analyses.claims import VERDICTS
from lens_position.ground.errors import BadInputError, CorruptFileError, UnknownModelError
from lens_position.models import load_model
from lens_position.models.zoo.corpus import corpus_of, is_held_out, unigram_bits_per_byte
from lens_position.models.zoo.recipe import DEFAULT_SEEDS, VARIANTS, Recipe, recipe_for
from lens_position.models.zoo.store import checkpoints, find, load_zoo_model, model_name, parse_name, verify
from lens_position.models.zoo.train import train
from lens_position.report import zoo as c3
from lens_position.report.html import report_figure_specs


@pytest.fixture(scope="module")
def small_corpus():
    """CPython's pydoc topics as a zoo-style corpus (small: a test trains on it in seconds)."""
    import pydoc_data.topics

    return corpus_of([pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics)])


def minute_recipe(corpus, variant: str = "tiny-test", **changes) -> Recipe:
    """A minute-sized recipe (seconds on 2 cores): 2 layers, d_model 32, context 32,
    with a context extension half way so the NTK rebuild is covered too."""
    fields = dict(variant=variant, n_layers=2, d_model=32, n_heads=2, d_mlp=64, context=32, batch=4,
                  steps=12, warmup=2, extend_at=6, ntk_alpha=2.0, attn_types=("global",) * 2,
                  corpus_sha256=corpus.sha256, eval_every=6, checkpoint_every=4, n_eval_sequences=8)
    fields.update(changes)
    return Recipe(**fields)


def test_same_recipe_and_seed_train_bit_identical_weights(small_corpus, tmp_path):
    recipe = minute_recipe(small_corpus)
    first = train(recipe, work_dir=tmp_path / "a", progress=False, corpus=small_corpus)
    second = train(recipe, work_dir=tmp_path / "b", progress=False, corpus=small_corpus)
    assert first.parameters.keys() == second.parameters.keys()
    for name in first.parameters:
        assert torch.equal(first.parameters[name], second.parameters[name]), name
    assert first.curve == [dict(c, seconds=f["seconds"]) for c, f in zip(second.curve, first.curve)]


def test_interrupted_training_resumes_to_the_same_weights(small_corpus, tmp_path):
    recipe = minute_recipe(small_corpus)
    whole = train(recipe, work_dir=tmp_path / "whole", progress=False, corpus=small_corpus)
    partial = train(recipe, work_dir=tmp_path / "split", progress=False, corpus=small_corpus, stop_after=5)
    assert partial.resumed_from == 0 and partial.held_out_bits != partial.held_out_bits  # NaN: unfinished
    resumed = train(recipe, work_dir=tmp_path / "split", progress=False, corpus=small_corpus)
    assert resumed.resumed_from == 5
    for name in whole.parameters:
        assert torch.equal(whole.parameters[name], resumed.parameters[name]), name


def test_measurements_along_training_change_no_weight_and_land_in_the_curve(small_corpus, tmp_path):
    from lens_position.analyses.zoo.sweep import sinks_along_training

    recipe = minute_recipe(small_corpus, context=64)  # the sink measurement reads T = 64
    plain = train(recipe, work_dir=tmp_path / "a", progress=False, corpus=small_corpus)
    measured = train(recipe, work_dir=tmp_path / "b", progress=False, corpus=small_corpus,
                     on_eval=lambda model: sinks_along_training(model, recipe=recipe))
    for name in plain.parameters:
        assert torch.equal(plain.parameters[name], measured.parameters[name]), name
    assert [c["step"] for c in measured.curve] == [6, 12]
    for point in measured.curve:
        assert 0 <= point["sink_rate"] <= 1 and 0 < point["max_sink_score"] <= 1
    assert "max_sink_score" not in plain.curve[0]
    # the last point's score is the finished model's, measured as a checkpoint is measured
    from lens_position.analyses.zoo.measure import sink_measurement
    from lens_position.models.zoo.architecture import build_model, load_parameters
    from lens_position.models.zoo.store import as_loaded_model

    model = build_model(recipe, initialise=False)
    load_parameters(model, measured.parameters)
    final = sink_measurement(as_loaded_model(model, recipe, name="zoo:tiny-test", source="test"))
    assert measured.curve[-1]["max_sink_score"] == pytest.approx(final["max_sink_score"], abs=1e-6)


def _recipes_corpus_is_this_pythons() -> bool:
    """Whether this CPython's standard-library text (the zoo's corpus) is the one the shipped recipes
    were written for (CPython 3.11.7's). On another Python the shipped checkpoints still load and
    run, but their recorded held-out loss is of another text and training from a recipe is refused."""
    from lens_position.models.zoo.corpus import training_split

    return training_split().sha256 == recipe_for("rope", 0).corpus_sha256


def _refuses_to_train_here(run) -> None:
    with pytest.raises(BadInputError, match="standard-library corpus has sha256 .* would not reproduce the recipe"):
        run()


def test_sink_trajectory_reads_a_point_while_it_trains_and_once_it_is_done(monkeypatch, tmp_path):
    from lens_position.analyses.zoo import sweep

    monkeypatch.setenv("LENS_POSITION_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(sweep, "SINK_SWEEP", (("tiny", "8 steps", {"steps": 8, "warmup": 2, "evaluations": 4}),))
    assert sweep.sink_trajectory("tiny", root=tmp_path / "sweep").empty
    recipe = sweep.point_recipe("tiny")
    from lens_position.analyses.zoo.training import default_work_dir

    if not _recipes_corpus_is_this_pythons():
        return _refuses_to_train_here(lambda: train(recipe, work_dir=default_work_dir(), progress=False))
    train(recipe, work_dir=default_work_dir(), progress=False, stop_after=4,
          on_eval=lambda model: sweep.sinks_along_training(model, recipe=recipe))
    partial = sweep.sink_trajectory("tiny", root=tmp_path / "sweep")
    assert list(partial["step"]) == [2, 4] and not partial["finished"].any()
    table = sweep.sink_sweep(root=tmp_path / "sweep", progress=False)  # resumes, finishes, measures
    done = sweep.sink_trajectory("tiny", root=tmp_path / "sweep")
    assert list(done["step"]) == [2, 4, 6, 8] and done["finished"].all()
    assert done["max_sink_score"].iloc[-1] == pytest.approx(table.loc[0, "max_sink_score"], abs=1e-6)
    assert list(done["lr"]) == [recipe.lr_at(s - 1) for s in (2, 4, 6, 8)]


def test_another_seed_trains_other_weights(small_corpus, tmp_path):
    a = train(minute_recipe(small_corpus, steps=4, extend_at=0), work_dir=tmp_path, progress=False,
              corpus=small_corpus)
    b = train(minute_recipe(small_corpus, steps=4, extend_at=0, seed=1), work_dir=tmp_path, progress=False,
              corpus=small_corpus)
    assert not torch.equal(a.parameters["blocks.0.attn.W_Q"], b.parameters["blocks.0.attn.W_Q"])


def test_training_refuses_a_corpus_that_is_not_the_recipes(small_corpus, tmp_path):
    recipe = minute_recipe(small_corpus, corpus_sha256="0" * 64)
    with pytest.raises(BadInputError, match="sha256"):
        train(recipe, work_dir=tmp_path, progress=False, corpus=small_corpus)


def test_recipe_hash_changes_with_every_field():
    base = VARIANTS["rope"]
    changed = {"seed": 1, "lr": 1e-3, "steps": 301, "context": 64, "bos": False, "window": 16,
               "ntk_alpha": 2.0, "corpus_sha256": "x", "train_fraction": 0.5}
    for field, value in changed.items():
        assert dataclasses.replace(base, **{field: value}).sha256() != base.sha256(), field
    assert Recipe.from_dict(base.to_dict()) == base
    # train_fraction came later: at 1.0 it is left out, so older recipes keep their hashes
    assert "train_fraction" not in base.to_dict()
    half = dataclasses.replace(base, train_fraction=0.5)
    assert Recipe.from_dict(half.to_dict()) == half
    with pytest.raises(BadInputError, match="train_fraction"):
        dataclasses.replace(base, train_fraction=0.0)


def test_train_subset_keeps_evenly_spaced_blocks_and_training_reads_only_them(small_corpus, tmp_path):
    from lens_position.models.zoo.corpus import SUBSET_BLOCK, train_subset

    stream = torch.arange(10 * SUBSET_BLOCK, dtype=torch.int64).to(torch.uint8)
    assert train_subset(stream, 1.0) is stream
    quarter = train_subset(torch.arange(10 * SUBSET_BLOCK) // SUBSET_BLOCK, 0.25)
    assert quarter.unique().tolist() == [3, 7]  # blocks 3 and 7 of 0-9: spread over the stream
    assert len(train_subset(small_corpus.train, 0.5)) == pytest.approx(len(small_corpus.train) / 2,
                                                                      abs=SUBSET_BLOCK)
    with pytest.raises(BadInputError, match="keeps no"):
        train_subset(stream[:SUBSET_BLOCK], 0.5)
    # a recipe on half the text trains other weights than on all of it, reproducibly
    half = minute_recipe(small_corpus, train_fraction=0.5)
    a = train(half, work_dir=tmp_path / "a", progress=False, corpus=small_corpus)
    b = train(half, work_dir=tmp_path / "b", progress=False, corpus=small_corpus)
    whole = train(minute_recipe(small_corpus), work_dir=tmp_path / "c", progress=False, corpus=small_corpus)
    assert all(torch.equal(a.parameters[k], b.parameters[k]) for k in a.parameters)
    assert not torch.equal(a.parameters["embed.W_E"], whole.parameters["embed.W_E"])


def test_variants_differ_only_in_their_position_fields():
    position_fields = {"variant", "position", "rotary_base", "attn_types", "window", "bos", "extend_at", "ntk_alpha"}
    base = VARIANTS["rope"].to_dict()
    for recipe in VARIANTS.values():
        differing = {k for k, v in recipe.to_dict().items() if base[k] != v}
        assert differing <= position_fields, (recipe.variant, differing - position_fields)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_each_variant_builds_the_position_mechanism_it_names(variant):
    from lens_position.models.zoo.architecture import build_model

    recipe = VARIANTS[variant]
    model = build_model(recipe)
    tokens = torch.randint(3, 259, (1, recipe.context))
    _, cache = model.run_with_cache(tokens)
    query = recipe.context - 1
    for layer, kind in enumerate(recipe.attn_types):
        pattern = cache[f"blocks.{layer}.attn.hook_pattern"][0, :, query]
        visible = (pattern > 0).sum(-1)
        expected = recipe.window if kind == "local" else query + 1
        assert (visible == expected).all(), (layer, kind, visible.tolist())
    if recipe.position == "rope":
        assert model.cfg.positional_embedding_type == "rotary"
        assert model.cfg.rotary_base == pytest.approx(recipe.rotary_base * recipe.ntk_alpha ** (16 / 14))
    elif recipe.position == "none":
        assert torch.count_nonzero(cache["hook_pos_embed"]) == 0
        assert not model.pos_embed.W_pos.requires_grad
    else:
        assert model.pos_embed.W_pos.requires_grad and model.pos_embed.W_pos.abs().sum() > 0


def test_held_out_split_is_by_document_hash_and_the_unigram_baseline_is_an_entropy(small_corpus):
    assert 0 < small_corpus.n_held_out_documents < small_corpus.n_documents
    assert is_held_out("x") == is_held_out("x")
    assert 0 < unigram_bits_per_byte(small_corpus) < 8


def test_zoo_names_parse_and_unknown_names_say_what_is_there():
    assert parse_name("zoo:rope") == ("rope", 0)
    assert parse_name("zoo:window-mix:seed2") == ("window-mix", 2)
    assert model_name("ntk", 0) == "zoo:ntk" and model_name("ntk", 1) == "zoo:ntk:seed1"
    with pytest.raises(BadInputError):
        parse_name("zoo:rope@seed1")
    with pytest.raises(UnknownModelError, match="lens-position zoo train"):
        find("zoo:rope:seed99")
    with pytest.raises(BadInputError):
        recipe_for("alibi")


SHIPPED = checkpoints()


def test_the_zoo_ships_every_variant():
    shipped = {c.variant for c in SHIPPED}
    assert shipped == set(VARIANTS), f"missing: {set(VARIANTS) - shipped}"


@pytest.mark.parametrize("checkpoint", SHIPPED, ids=[c.name for c in SHIPPED])
def test_shipped_checkpoint_matches_its_recipe_hash_and_loads_offline(checkpoint):
    recipe = verify(checkpoint)
    assert recipe == recipe_for(checkpoint.variant, checkpoint.seed)
    assert checkpoint.seed in DEFAULT_SEEDS
    loaded = load_model(checkpoint.name)
    assert loaded.spec.extra["recipe_sha256"] == recipe.sha256()
    assert loaded.spec.tokenizer_prepends_bos == recipe.bos
    meta = checkpoint.meta
    assert meta["held_out_bits_per_byte"] < meta["unigram_bits_per_byte"]
    assert "sink_rate" in meta["sinks"]
    # the loaded model computes what training measured: same held-out loss
    from lens_position.models.zoo.corpus import evaluation_batch, training_split
    from lens_position.models.zoo.train import LN2, next_byte_loss

    corpus = training_split()
    if not _recipes_corpus_is_this_pythons():  # another CPython's text: the recorded loss is not of it
        assert corpus.sha256 != recipe.corpus_sha256
        return
    tokens = evaluation_batch(corpus.held_out, n=recipe.n_eval_sequences, context=recipe.context, bos=recipe.bos)
    with torch.no_grad():
        bits = float(next_byte_loss(loaded.model, tokens)) / LN2
    assert bits == pytest.approx(meta["held_out_bits_per_byte"], abs=1e-4)


def test_shipped_variants_of_one_seed_have_distinct_weights():
    by_seed: dict[int, dict[str, str]] = {}
    for c in SHIPPED:
        by_seed.setdefault(c.seed, {})[c.variant] = c.meta["weights_sha256"]
    for seed, weights in by_seed.items():
        assert len(set(weights.values())) == len(weights), (seed, weights)


def test_a_checkpoint_whose_recipe_was_edited_is_refused(tmp_path):
    source = SHIPPED[0]
    root = tmp_path / "zoo"
    (root / source.variant).mkdir(parents=True)
    shutil.copy(source.weights, root / source.variant / source.weights.name)
    meta = dict(source.meta)
    meta["recipe"] = dict(meta["recipe"], lr=1.0)
    (root / source.variant / f"seed{source.seed}.json").write_text(json.dumps(meta))
    with pytest.raises(CorruptFileError, match="hashes to"):
        load_zoo_model(source.name, root=root)


def test_position_options_are_refused_on_zoo_models():
    with pytest.raises(BadInputError, match="as trained"):
        load_model(SHIPPED[0].name, ntk_alpha=2.0)


def _layers(variant: str, seed: int, per_layer: list[float], T: int = 128) -> pd.DataFrame:
    """``per_layer`` is R' (the reference-free split the claims use); the self-referenced R is a
    constant, so an answer read off the wrong split resolves nothing."""
    return pd.DataFrame({"model": model_name(variant, seed), "layer": range(len(per_layer)), "key_set": "all",
                         "R_rf_heldout": per_layer, "M_rf_heldout": 0.1, "R_heldout": 0.3, "M_heldout": 0.2,
                         "total_heldout": 0.2, "seq_len": T})


def test_c3_answers_come_from_paired_seed_differences():
    frames = []
    for seed in range(3):
        frames.append(_layers("ntk-control", seed, [0.10 + 0.01 * seed] * 4))
        frames.append(_layers("ntk", seed, [0.05 + 0.01 * seed + 0.001 * seed ** 2] * 4))
        frames.append(_layers("rope", seed, [0.1, 0.1, 0.1, 0.1]))
        frames.append(_layers("window", seed, [0.1, 0.1 + 0.1, 0.1 + 0.2 + 0.01 * seed, 0.4]))
    answer = c3.answers(c3.models_table({"decompose_layers": pd.concat(frames)})).set_index(["a", "b", "metric"])
    ntk = answer.loc[("ntk", "ntk-control", "R")]
    assert ntk["verdict"] == "lower" and ntk["n_seeds"] == 3
    assert ntk["difference"] == pytest.approx(-0.05 + 0.001 * (0 + 1 + 4) / 3)
    assert answer.loc[("window", "rope", "R_slope")]["verdict"] == "higher"
    assert answer.loc[("nope", "rope", "R")]["verdict"].startswith("not resolved")
    models = c3.models_table({"decompose_layers": pd.concat(frames)})
    assert (models["R_self"] == 0.3).all() and (models["M_self"] == 0.2).all()


def test_a_paired_difference_across_lengths_is_not_compared():
    """The same resolved differences, with the window variant decomposed at another T than rope:
    that question is not compared (it would measure T), the NTK one, at one T, still is."""
    frames = []
    for seed in range(3):
        frames.append(_layers("ntk-control", seed, [0.10 + 0.01 * seed] * 4))
        frames.append(_layers("ntk", seed, [0.05 + 0.01 * seed] * 4))
        frames.append(_layers("rope", seed, [0.1, 0.1, 0.1, 0.1]))
        frames.append(_layers("window", seed, [0.1, 0.2, 0.3 + 0.01 * seed, 0.4], T=256))
    answer = c3.answers(c3.models_table({"decompose_layers": pd.concat(frames)})).set_index(["a", "b", "metric"])
    window = answer.loc[("window", "rope", "R_slope")]
    assert window["verdict"].startswith("not compared") and "128, 256" in window["verdict"]
    ntk = answer.loc[("ntk", "ntk-control", "R")]
    assert ntk["verdict"] == "lower" and ntk["seq_len"] == 128


def test_t_interval_uses_student_t_quantiles():
    assert c3.t_quantile(0.975, 2) == pytest.approx(4.3027, abs=1e-3)
    assert c3.t_quantile(0.975, 30) == pytest.approx(2.0423, abs=1e-3)
    mean, sd, low, high, n = c3.interval([1.0, 2.0, 3.0])
    assert (mean, sd, n) == (2.0, 1.0, 3) and high - mean == pytest.approx(4.3027 / 3 ** 0.5, abs=1e-3)


def test_reproduce_on_zoo_models_writes_the_c3_answer(tmp_path):
    from lens_position.pipeline.config import DataOptions, RunConfig
    from lens_position.pipeline.runner import run

    seeds = sorted({c.seed for c in SHIPPED if c.variant == "ntk"}
                   & {c.seed for c in SHIPPED if c.variant == "ntk-control"})[:2]
    names = [model_name(v, s) for s in seeds for v in ("ntk", "ntk-control")]
    config = RunConfig(out=tmp_path / "out", models=tuple(names), steps=("decompose",), data=DataOptions(),
                       quick=True, browser_check=False, progress=False)
    result = run(config)
    answer = pd.read_csv(result.files["zoo_c3"])
    row = answer[(answer["a"] == "ntk") & (answer["metric"] == "R")].iloc[0]
    assert row["n_seeds"] == len(names) // 2
    # The zoo's answer is a section of report.html (figures drawn like the others), not a page of its own.
    report_html = result.files["report"].read_text()
    assert '<section id="zoo">' in report_html and 'id="zoo-c3"' in report_html
    assert {"zoo_depth", "zoo_loss"} <= set(report_figure_specs(report_html))
    assert not (tmp_path / "out" / "zoo.html").exists()


def _labelled_layers(variant: str, seed: int, per_layer: list[float]) -> pd.DataFrame:
    name = model_name(variant, seed)
    return _layers(variant, seed, per_layer).assign(architecture=f"standard RoPE: {name}", role="standard")


def test_report_has_a_zoo_section_only_when_the_run_has_zoo_models():
    from fake_results import fake_results

    from lens_position.report.html import build_report

    zoo = pd.concat([_labelled_layers(v, seed, [0.05 + 0.01 * seed + (0.02 if v == "ntk" else 0.0)] * 4)
                     for seed in range(3) for v in ("ntk", "ntk-control")])
    text = build_report({"decompose_layers": zoo})
    section = text[text.index('<section id="zoo">'):]
    # C3 answered from the paired seeds, with its interval; questions about absent variants named as not asked.
    assert "ntk − ntk-control (R)" in section and "+0.0200 [+0.0200, +0.0200]" in section
    assert "<b>higher</b>" in section and "Not asked (a variant is not in this run): window − rope" in section
    # C1-C5 for every variant and seed, the seed-to-seed spread, and the figures.
    claims_rows = section[section.index('id="zoo-claims"'):section.index("</table>", section.index('id="zoo-claims"'))]
    assert claims_rows.count("<tr><td>ntk</td>") == 3 and claims_rows.count("<tr><td>ntk-control</td>") == 3
    assert "0.0800 ± 0.0100 [0.0552, 0.1048]" in section  # ntk R: mean ± sd [t-interval] over seeds 0.07, 0.08, 0.09
    assert {"zoo_depth", "zoo_loss"} <= set(report_figure_specs(text))
    assert 'id="zoo"' not in build_report(fake_results())


def test_sinks_sentence_says_plainly_when_no_sink_formed():
    from types import SimpleNamespace

    def fake(name, rate, score):
        return SimpleNamespace(name=name, meta={"sinks": {"sink_rate": rate, "max_sink_score": score}})

    none = c3.sinks_sentence([fake("zoo:rope", 0.0, 0.12), fake("zoo:nope:seed2", 0.002, 0.174)])
    assert none.startswith("No zoo model formed an attention sink") and "0.174, is a head of zoo:nope:seed2" in none
    assert "0.000–0.002" in none and "zoo sink-sweep" in none
    some = c3.sinks_sentence([fake("zoo:rope", 0.0, 0.12), fake("zoo:learned", 0.06, 0.41)])
    assert some.startswith("1 of 2 zoo models have a head") and "0.410, in zoo:learned" in some

def test_sink_sweep_points_change_only_the_budget_schedule_decay_or_text_of_the_rope_recipe():
    from lens_position.analyses.zoo.sweep import SINK_SWEEP, point_recipe

    rope = dataclasses.asdict(recipe_for("rope"))
    budget = {"variant", "steps", "context", "batch", "d_model", "d_mlp", "eval_every", "checkpoint_every",
              "final_lr_fraction", "weight_decay", "train_fraction"}
    assert point_recipe("zoo") == recipe_for("rope")
    for point, _, _ in SINK_SWEEP[1:]:
        changed = {k for k, v in dataclasses.asdict(point_recipe(point)).items() if rope[k] != v}
        assert changed <= budget and "variant" in changed, (point, changed)
        variant = point_recipe(point).variant  # its checkpoint's name must read back (measure_sinks loads it)
        assert parse_name(model_name(variant, 0)) == (variant, 0)
        assert point_recipe(point).tokens >= recipe_for("rope").tokens
    with pytest.raises(BadInputError, match="steps-4x"):
        point_recipe("no-such-point")


def test_sink_sweep_trains_measures_and_then_reads_its_points(monkeypatch, tmp_path):
    from lens_position.analyses.zoo import sweep

    monkeypatch.setenv("LENS_POSITION_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(sweep, "SINK_SWEEP", (("zoo", "the shipped recipe", {}),
                                              ("tiny", "6 steps", {"steps": 6, "warmup": 2})))
    if not _recipes_corpus_is_this_pythons():
        return _refuses_to_train_here(lambda: sweep.sink_sweep(root=tmp_path / "sweep", progress=False))
    table = sweep.sink_sweep(root=tmp_path / "sweep", progress=False)
    assert list(table["point"]) == ["zoo", "tiny"] and list(table["steps"]) == [300, 6]
    shipped = find("zoo:rope").meta["sinks"]
    assert table.loc[0, "max_sink_score"] == shipped["max_sink_score"]  # read from the shipped checkpoint
    tiny = find("zoo:sink-tiny", tmp_path / "sweep")
    assert tiny.meta["sinks"]["max_sink_score"] == table.loc[1, "max_sink_score"] > 0
    again = sweep.sink_sweep(root=tmp_path / "sweep", progress=False)  # read, not retrained
    assert again.loc[1, "train_seconds"] == table.loc[1, "train_seconds"]


def test_the_sink_sweep_command_trains_each_point_once_per_seed_and_writes_both_tables(monkeypatch, tmp_path):
    from lens_position.analyses.zoo import sweep
    from lens_position.cli.commands import main

    monkeypatch.setenv("LENS_POSITION_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(sweep, "SINK_SWEEP", (("tiny", "6 steps", {"steps": 6, "warmup": 2, "evaluations": 3}),))
    out, trajectory_out = tmp_path / "sweep.csv", tmp_path / "trajectory.csv"
    if not _recipes_corpus_is_this_pythons():  # refused on the command line: a one-line error, exit 1
        assert main(["zoo", "sink-sweep", "--root", str(tmp_path / "sweep"), "--no-progress",
                     "--out", str(out)]) == 1
        return
    assert main(["zoo", "sink-sweep", "--root", str(tmp_path / "sweep"), "--seed", "0", "1", "--no-progress",
                 "--out", str(out), "--trajectory-out", str(trajectory_out)]) == 0
    table, trajectory = pd.read_csv(out), pd.read_csv(trajectory_out)
    assert list(zip(table["point"], table["seed"])) == [("tiny", 0), ("tiny", 1)]
    assert table.loc[0, "max_sink_score"] != table.loc[1, "max_sink_score"]  # two trainings, not one read twice
    assert list(trajectory["seed"]) == [0, 0, 0, 1, 1, 1] and list(trajectory["step"]) == [2, 4, 6] * 2
    for seed in (0, 1):
        last = trajectory[trajectory["seed"] == seed].iloc[-1]
        assert last["max_sink_score"] == pytest.approx(table.loc[seed, "max_sink_score"], abs=1e-6)


def test_sweep_sentence_names_where_sinks_form_or_the_trend_without():
    from lens_position.analyses.zoo.sweep import sweep_sentence

    rows = [("zoo", "the shipped recipe", 614_400, 298_435, 128, 0.0, 0.097),
            ("steps-4x", "4x the steps", 2_457_600, 298_435, 128, 0.0, 0.15),
            ("width-128", "4x the steps, d_model 128", 2_457_600, 1_120_899, 128, 0.01, 0.21)]
    table = pd.DataFrame(rows, columns=["point", "change", "tokens", "parameters", "context", "sink_rate",
                                        "max_sink_score"])
    none = sweep_sentence(table)
    assert none.startswith("No point of the sweep formed a sink") and "from 0.097" in none
    assert "0.210 at the largest budget tried (`width-128`" in none
    assert "the most tokens: `steps-4x`, 2.5 M; the most parameters: `width-128`, 1.12 M" in none
    formed = sweep_sentence(table.assign(max_sink_score=[0.097, 0.35, 0.5], sink_rate=[0, 0.06, 0.2]))
    assert formed.startswith("Sinks form at `steps-4x`") and "0.350 > ε = 0.3" in formed
    assert "seeds measured there" not in formed  # one seed: nothing to count
    # More seeds of a point: the sentence says in how many of them the score exceeded ε.
    seeds = pd.concat([table.assign(seed=0, max_sink_score=[0.097, 0.35, 0.2]),
                       table.iloc[[1, 1, 1]].assign(seed=[1, 2, 3], max_sink_score=[0.2, 0.31, 0.1])])
    counted = sweep_sentence(seeds)
    assert "0.350 > ε = 0.3, sink rate 0.000 in seed 0, and above ε in 2 of the 4 seeds measured there" in counted


def test_a_run_with_other_models_keeps_the_zoo_out_of_the_papers_claims(tmp_path):
    from lens_position.pipeline.config import DataOptions, RunConfig
    from lens_position.pipeline.runner import run

    zoo = [model_name(v, s) for s in (0, 1) for v in ("ntk", "ntk-control")]
    config = RunConfig(out=tmp_path / "out", models=("tiny-llama", *zoo), steps=("decompose",), data=DataOptions(),
                       quick=True, browser_check=False, progress=False)
    result = run(config)
    # The claims (C3 compares every NTK model with every standard one) are the other models' alone ...
    assert not result.claims["architecture"].str.contains("zoo:").any()
    # ... and the zoo gets its own C1-C5 per model and its own section of report.html.
    per_model = pd.read_csv(result.files["zoo_claims"])
    assert sorted(per_model["model"]) == sorted(zoo) and set(per_model["C1"]) <= set(VERDICTS)
    text = result.files["report"].read_text()
    main_part, zoo_part = text.split('<section id="zoo">')
    assert "zoo:ntk" not in main_part.split("<h2>Provenance</h2>")[0].split('id="claims"')[1].split("</table>")[0]
    assert "ntk − ntk-control (R)" in zoo_part


def test_trajectory_sentence_names_the_first_crossing_or_how_far_the_score_got():
    from lens_position.analyses.zoo.sweep import TRAJECTORY_POINTS, trajectory_figure, trajectory_sentence

    def trajectory(scores, finished=True, point=TRAJECTORY_POINTS[0], seed=0):
        return pd.DataFrame([{"point": point, "seed": seed, "step": 800 * (k + 1), "tokens": 800 * (k + 1) * 2048,
                              "lr": 0.003, "held_out_bits": 2.0, "sink_rate": 0.05 * (s > 0.3),
                              "max_sink_score": s, "finished": finished} for k, s in enumerate(scores)])

    formed = trajectory_sentence(trajectory([0.1, 0.2, 0.29, 0.35, 0.5]))
    assert "first exceeds ε = 0.3 at 6.6 M tokens (step 3200" in formed and "0.350, after 0.290 at 4.9 M" in formed
    assert f"along `{TRAJECTORY_POINTS[0]}` seed 0 (" in formed
    assert "sink rate 0.050 there" in formed and "so far" not in formed
    assert "above ε at 2 of the 2 measurements from there on" in formed
    wavering = trajectory_sentence(trajectory([0.2, 0.31, 0.25, 0.33, 0.28], point="steps-64x-wd-0.5"))
    assert "above ε at 2 of the 4 measurements" in wavering and "weight decay 0.5" in wavering
    unfinished = trajectory_sentence(trajectory([0.1, 0.12, 0.2], finished=False))
    assert unfinished.startswith("No sink") and "measured up to 4.9 M tokens so far" in unfinished
    assert "from 0.100 at 1.6 M tokens to 0.200 at 4.9 M" in unfinished
    both = pd.concat([trajectory([0.1, 0.35]), trajectory([0.2, 0.25], point=TRAJECTORY_POINTS[1])])
    from lens_position.analyses.zoo.sweep import trajectory_markdown

    table = trajectory_markdown(both, every=2).splitlines()
    assert len(table) == 2 + 2 and "| 0 | 1600 | 3.3 M | 0.003 | 2.000 | 0.050 | 0.350 |" in table[2]
    assert len(trajectory_figure(both).data) == 4  # score and rate per point
    with pytest.raises(ValueError, match="one point and seed"):
        trajectory_sentence(both)
    two_seeds = pd.concat([trajectory([0.1, 0.35]), trajectory([0.2, 0.25], seed=1)])
    assert len(trajectory_figure(two_seeds).data) == 4  # score and rate per seed
    with pytest.raises(ValueError, match="one point and seed"):
        trajectory_sentence(two_seeds)
    assert "seed 1 (" in trajectory_sentence(trajectory([0.2, 0.25], seed=1))


def test_seeds_sentence_counts_the_seeds_that_formed_a_sink():
    from lens_position.analyses.zoo.sweep import seeds_sentence

    def run(scores, seed, finished=True):
        return pd.DataFrame([{"point": "steps-64x-wd-0.5", "seed": seed, "step": 800 * (k + 1),
                              "tokens": 800 * (k + 1) * 2048, "lr": 0.003, "held_out_bits": 2.0, "sink_rate": 0.0,
                              "max_sink_score": s, "finished": finished} for k, s in enumerate(scores)])

    runs = pd.concat([run([0.1, 0.35, 0.47], 0), run([0.1, 0.243, 0.233], 1), run([0.12, 0.29], 2, finished=False)])
    text = seeds_sentence(runs)
    assert text.startswith("Across 3 seeds of `steps-64x-wd-0.5` (39.3 M tokens each), a head's sink score "
                           "exceeded ε = 0.3 in 1: seed 0 (first at 3.3 M tokens, 0.470 at the last measurement).")
    assert "It never did in seeds 1 and 2 (highest score 0.243 and 0.290 respectively)." in text
    assert "Still training: seed 2 up to 3.3 M tokens measured." in text
    from lens_position.analyses.zoo.sweep import trajectory_sentences

    sentences = trajectory_sentences(runs)  # one per run, then the count over seeds
    assert len(sentences) == 4 and [" seed 0 (" in x for x in sentences[:3]] == [True, False, False]
    assert sentences[1].startswith("No sink along `steps-64x-wd-0.5` seed 1 (") and sentences[3] == text
    assert len(trajectory_sentences(run([0.1, 0.2], 4))) == 1  # one seed: nothing to count
    one = seeds_sentence(run([0.1, 0.2], 4))
    assert "in 0." in one and "It never did in seed 4 (highest score 0.200)." in one
    with pytest.raises(ValueError, match="one point"):
        seeds_sentence(pd.concat([runs, run([0.1], 0).assign(point="steps-64x")]))


def test_the_shipped_sink_sweep_table_is_the_sweeps_points():
    from lens_position.analyses.zoo.sweep import SINK_SWEEP, measured_sweep, point_recipe

    table = measured_sweep()
    unigram = find("zoo:rope").meta["unigram_bits_per_byte"]
    assert list(table.loc[table["seed"] == 0, "point"]) == [p for p, _, _ in SINK_SWEEP]
    assert not table.duplicated(["point", "seed"]).any()
    for row in table.itertuples():
        recipe = point_recipe(row.point, row.seed)
        assert (row.steps, row.tokens, row.d_model, row.context) == (recipe.steps, recipe.tokens, recipe.d_model,
                                                                     recipe.context)
        assert 0 <= row.sink_rate <= 1 and 0 < row.max_sink_score < 1 and row.held_out_bits < unigram


def test_the_shipped_trajectories_are_the_long_points_whole_runs():
    from lens_position.analyses.zoo.sweep import TRAJECTORY_POINTS, measured_sweep, measured_trajectory, point_recipe

    trajectory, table = measured_trajectory(), measured_sweep().set_index(["point", "seed"])
    assert list(trajectory.loc[trajectory["seed"] == 0, "point"].unique()) == list(TRAJECTORY_POINTS)
    assert set(trajectory["point"]) == set(TRAJECTORY_POINTS) and trajectory["finished"].all()
    for (point, seed), rows in trajectory.groupby(["point", "seed"]):
        recipe = point_recipe(point, seed)
        assert list(rows["step"]) == list(range(recipe.eval_every, recipe.steps + 1, recipe.eval_every))
        assert list(rows["lr"]) == pytest.approx([recipe.lr_at(s - 1) for s in rows["step"]])
        last = rows.iloc[-1]  # measured along training = measured on the saved checkpoint
        assert last["max_sink_score"] == pytest.approx(table.loc[(point, seed), "max_sink_score"], abs=1e-6)
        assert last["held_out_bits"] == pytest.approx(table.loc[(point, seed), "held_out_bits"])
