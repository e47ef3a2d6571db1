"""Model names say what the model is: the default SmolLM2 is the Instruct model at Q4_1."""

from lens_position.models.registry import DEFAULT_MODELS, REGISTRY


def test_the_default_smollm2_says_it_is_the_instruct_model_at_q4_1_and_has_a_name_that_says_so():
    default, honest = REGISTRY["smollm2-135m"], REGISTRY["smollm2-135m-instruct-q4_1"]
    for entry in (default, honest):
        assert "Instruct" in entry.description and "Q4_1" in entry.description
    assert (honest.kind, honest.locate_name, honest.options) == (default.kind, default.locate_name, default.options)
    assert "smollm2-135m-instruct-q4_1" not in DEFAULT_MODELS  # one model, run once by reproduce
