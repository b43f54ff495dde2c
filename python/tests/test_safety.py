"""klein_edge's safety check (issue 66): safety_model= classifies the generated image; above
safety_threshold it raises Flagged (the probability named), or with safety_action="blur"
returns the image blurred; the verdict is in image.info["klein"]."""
import json

import pytest

import klein_edge


def test_flagged_blurred_and_recorded(model, testdata):
    classifier = testdata / "safety-tiny" / "model"
    args = dict(width=32, height=32, steps=1, seed=2, safety_model=classifier)
    passed = model.generate("a fox", safety_threshold=1, **args)
    verdict = json.loads(passed.info["klein"])["safety"]
    assert verdict["flagged"] is False and verdict["threshold"] == 1.0
    assert verdict["nsfw"] > 0

    with pytest.raises(klein_edge.Flagged, match="above the threshold 0.0000"):
        model.generate("a fox", safety_threshold=0, **args)

    blurred = model.generate("a fox", safety_threshold=0, safety_action="blur", **args)
    verdict = json.loads(blurred.info["klein"])["safety"]
    assert verdict["blurred"] is True and verdict["flagged"] is True
    assert blurred.tobytes() != passed.tobytes()

    with pytest.raises(ValueError, match="safety_threshold"):
        model.generate("a fox", safety_threshold=1.5, **args)
    with pytest.raises(ValueError, match="need safety_model"):
        model.generate("a fox", safety_threshold=0.5, width=32, height=32, steps=1)
