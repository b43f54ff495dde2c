"""Bad input: exceptions that carry the engine's message (naming the file or the option), and
a model that keeps working after them."""
import pytest

import klein_edge

PROMPT = "a small red cube"


def test_a_missing_model_names_the_path(tmp_path):
    missing = tmp_path / "no-such-model.klein"
    with pytest.raises(klein_edge.KleinError, match="no-such-model.klein"):
        klein_edge.Model(missing)


def test_a_file_that_is_not_a_model_is_refused(tmp_path):
    bad = tmp_path / "bad.klein"
    bad.write_bytes(b"not a container at all")
    with pytest.raises(klein_edge.KleinError) as e:
        klein_edge.Model(bad)
    assert "bad.klein" in str(e.value)


def test_engine_errors_name_the_option(model, tmp_path):
    with pytest.raises(klein_edge.KleinError, match="width: expected 0 or 16 to 8192, got 8"):
        model.generate(PROMPT, width=8, height=32, steps=1, seed=1)
    with pytest.raises(klein_edge.KleinError, match="guidance"):
        model.generate(PROMPT, width=32, height=32, steps=1, seed=1, guidance=500)
    with pytest.raises(klein_edge.KleinError, match="strength"):
        model.generate(PROMPT, width=32, height=32, steps=1, seed=1,
                       init_image=tmp_path / "missing.png", strength=1.5)
    with pytest.raises(klein_edge.KleinError, match="missing-ref.png"):
        model.generate(PROMPT, width=32, height=32, steps=1, seed=1,
                       references=[tmp_path / "missing-ref.png"])
    with pytest.raises(klein_edge.KleinError, match="not-a-lora.safetensors"):
        model.generate(PROMPT, width=32, height=32, steps=1, seed=1,
                       loras=[tmp_path / "not-a-lora.safetensors"])
    assert model.generate(PROMPT, width=32, height=32, steps=1, seed=1).size == (32, 32)


def test_python_side_checks_name_the_argument(model, tiny_model):
    with pytest.raises(TypeError, match="prompt"):
        model.generate(None)
    with pytest.raises(ValueError, match="seed"):
        model.generate(PROMPT, seed=-1)
    with pytest.raises(TypeError, match="width"):
        model.generate(PROMPT, width=32.5)
    with pytest.raises(TypeError, match=r"references\[0\]"):
        model.generate(PROMPT, references=[42])
    with pytest.raises(ValueError, match=r"loras\[0\]"):
        model.generate(PROMPT, loras=[("x.safetensors", float("nan"))])
    for count in (0, 1001, 2.0, True):
        with pytest.raises(ValueError, match="count"):
            model.generate(PROMPT, count=count)
    with pytest.raises(ValueError, match="precision"):
        klein_edge.Model(tiny_model, precision="fastest")


def test_a_closed_model_says_so(tiny_model):
    m = klein_edge.Model(tiny_model, threads=1)
    m.close()
    with pytest.raises(klein_edge.KleinError, match="closed"):
        m.generate(PROMPT, width=32, height=32, steps=1, seed=1)
    m.close()  # twice is fine
