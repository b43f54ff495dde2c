"""klein_edge's prompt check (issue 66): check_prompt=True asks the text encoder before any work;
a flagged prompt raises Flagged, a passed one is generated. The tiny klein-9B answers "yes" to
the first prompt and "no" to the second, as transformers does (tests/data/prompt-check); checked
through `klein check-prompt`."""
import pathlib

import pytest

import klein_edge

FLAGGED = "Mickey Mouse eating ice cream"
PASSED = "a bowl of fruit"
NINE_B = pathlib.Path(__file__).resolve().parents[2] / "tests" / "data" / "klein-tiny-9b" / "model"


def test_flagged_prompt_raises_before_any_work(klein_binary):
    import subprocess
    done = subprocess.run([str(klein_binary), "check-prompt", "--no-cache", "--threads", "2", "-m", str(NINE_B),
                           "-p", FLAGGED, "-p", PASSED], capture_output=True, text=True)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"FLAGGED: {FLAGGED}" in done.stdout and f"passed: {PASSED}" in done.stdout

    phases = []
    args = dict(width=32, height=32, steps=1, seed=2, check_prompt=True,
                progress=lambda phase, done, total, seconds: phases.append(phase))
    with klein_edge.Model(NINE_B, threads=2) as m:
        with pytest.raises(klein_edge.Flagged, match="flagged by params.check_prompt"):
            m.generate(FLAGGED, **args)
        assert phases == []  # nothing began
        image = m.generate(PASSED, **args)
        assert image.size == (32, 32) and phases
        with pytest.raises(TypeError, match="check_prompt"):
            m.generate(PASSED, width=32, height=32, steps=1, check_prompt=1)
