"""Where the tests find the engine and the data. Under ctest (tests/CMakeLists.txt) the
environment names the built files; run by hand from the repository root they default to the
Release build (build/) and ../shared/testdata:

    KLEIN_LIBRARY=build/libklein.so.0 /usr/bin/python3 -m pytest python/tests
"""
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))  # the package of this tree, not an installed one
os.environ["KLEIN_LIBRARY"] = os.path.abspath(
    os.environ.get("KLEIN_LIBRARY") or REPO / "build" / "libklein.so.0")


def _path(env, default):
    return pathlib.Path(os.environ.get(env) or default)


@pytest.fixture(scope="session")
def klein_binary():
    return _path("KLEIN_BINARY", REPO / "build" / "klein")


@pytest.fixture(scope="session")
def testdata():
    return _path("KLEIN_TESTDATA", REPO.parent / "shared" / "testdata")


@pytest.fixture(scope="session")
def tiny_model(testdata):
    return testdata / "klein-tiny" / "model"


@pytest.fixture(scope="session")
def model(tiny_model):
    import klein_edge
    with klein_edge.Model(tiny_model, threads=2) as m:
        yield m


@pytest.fixture(scope="session")
def cli(klein_binary):
    """Runs `klein ARGS...`; fails the test with the CLI's output when it fails."""
    def run(*args):
        done = subprocess.run([str(klein_binary), *map(str, args)], capture_output=True,
                              text=True)
        assert done.returncode == 0, f"klein {' '.join(map(str, args))}:\n{done.stderr}"
        return done
    return run


@pytest.fixture(scope="session")
def lora_fixtures(tmp_path_factory, tiny_model):
    """The LoRA files the C++ tests use (tools/lora/lora_fixture.py make)."""
    out = tmp_path_factory.mktemp("loras")
    subprocess.run([sys.executable, str(REPO / "tools" / "lora" / "lora_fixture.py"), "make",
                    str(tiny_model / "transformer" / "diffusion_pytorch_model.safetensors"),
                    str(out)], check=True, capture_output=True)
    return out
