"""klein_edge marks what it makes as `klein generate` does: a 256x256 image (the smallest the
dwtDct method marks) carries FLUX's message unless watermark=False, and its metadata says which.
The mark is read back from the saved file by `klein watermark --check` (the decoder checked
against the official library in tests/image)."""
import json
import pathlib
import subprocess

import klein_edge

REPO = pathlib.Path(__file__).resolve().parents[2]


def official_mark():
    """BFL's 46 bits as the official library's fixtures record them."""
    manifest = REPO / "tests" / "data" / "watermark" / "manifest.json"
    return json.loads(manifest.read_text())["message_bits"]


def check(klein_binary, path):
    done = subprocess.run([str(klein_binary), "watermark", "--json", "--check", str(path)],
                          capture_output=True, text=True)
    assert done.returncode in (0, 2), done.stderr
    return done.returncode, json.loads(done.stdout)


def test_marked_by_default_and_not_with_watermark_false(model, klein_binary, tmp_path):
    marked = model.generate("a fox", width=256, height=256, steps=1, seed=2)
    plain = model.generate("a fox", width=256, height=256, steps=1, seed=2, watermark=False)
    assert marked.size == plain.size == (256, 256)
    assert marked.tobytes() != plain.tobytes()

    mark = official_mark()
    m = json.loads(marked.info["klein"])["watermark"]
    assert m["embedded"] is True and m["bits"] == mark
    p = json.loads(plain.info["klein"])["watermark"]
    assert p["embedded"] is False and p["note"] == "turned off"

    klein_edge.save(marked, tmp_path / "marked.png")
    klein_edge.save(plain, tmp_path / "plain.png")
    rc, reading = check(klein_binary, tmp_path / "marked.png")
    assert (rc, reading["bits"], reading["flux_mark"]) == (0, mark, True)
    rc, reading = check(klein_binary, tmp_path / "plain.png")
    assert rc == 2 and reading["bits"] != mark and reading["flux_mark"] is False
