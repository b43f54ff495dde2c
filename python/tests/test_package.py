"""The package itself: its ctypes structs are the header's, and `pip install ./python`
(offline, into a virtual environment over Debian's packages) gives a package that works from
anywhere without the source tree."""
import ctypes
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from klein_edge import _capi

REPO = pathlib.Path(__file__).resolve().parents[2]

STRUCTS = {
    "klein_model_options": _capi.ModelOptions,
    "klein_session_options": _capi.SessionOptions,
    "klein_progress": _capi.Progress,
    "klein_preview": _capi.Preview,
    "klein_generate_params": _capi.GenerateParams,
    "klein_image": _capi.Image,
}


def test_structs_have_the_headers_sizes_and_offsets(tmp_path):
    # A C program prints sizeof and offsetof of every field as the compiler lays them out.
    lines = ["#include <stddef.h>", "#include <stdio.h>", '#include "klein/klein.h"',
             "int main(void) {"]
    for c_name, struct in STRUCTS.items():
        lines.append(f'  printf("{c_name} %zu\\n", sizeof({c_name}));')
        for field, _ in struct._fields_:
            lines.append(f'  printf("{c_name}.{field} %zu\\n", offsetof({c_name}, {field}));')
    lines += ["  return 0;", "}"]
    source = tmp_path / "layout.c"
    source.write_text("\n".join(lines) + "\n")
    compiler = shutil.which("cc") or shutil.which("gcc")
    assert compiler, "a C compiler (build-essential) is needed for this test"
    subprocess.run([compiler, "-I", str(REPO / "include"), str(source), "-o",
                    str(tmp_path / "layout")], check=True)
    printed = dict(line.rsplit(" ", 1) for line in
                   subprocess.check_output([str(tmp_path / "layout")], text=True).splitlines())

    ours = {}
    for c_name, struct in STRUCTS.items():
        ours[c_name] = str(ctypes.sizeof(struct))
        for field, _ in struct._fields_:
            ours[f"{c_name}.{field}"] = str(getattr(struct, field).offset)
    assert ours == printed


def test_struct_fields_are_the_headers_fields():
    # Every field the header declares is mirrored (a field added to the header and not here
    # would make the sizes differ too; this names it).
    header = (REPO / "include" / "klein" / "klein.h").read_text()
    for c_name, struct in STRUCTS.items():
        body = header.split(f"typedef struct {c_name} {{", 1)[1].split(f"}} {c_name};", 1)[0]
        for field, _ in struct._fields_:
            assert field in body, f"{c_name}.{field} is not in klein.h"


def test_pip_install_gives_a_package_that_works_outside_the_tree(tmp_path, tiny_model):
    library = os.environ["KLEIN_LIBRARY"]
    venv = tmp_path / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", str(venv)],
                   check=True)
    # pip builds in place; a copy of python/ keeps the source tree free of build/ folders.
    source = tmp_path / "python"
    shutil.copytree(REPO / "python", source,
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "tests"))
    env = dict(os.environ, KLEIN_LIBRARY=library, PIP_NO_INDEX="1",
               PIP_DISABLE_PIP_VERSION_CHECK="1")
    done = subprocess.run([str(venv / "bin" / "pip"), "install", str(source)], env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "bundled" in done.stdout or "bundled" in done.stderr or \
        list(venv.glob("lib/python3*/site-packages/klein_edge/libklein.so.0"))

    # Run from an empty folder with no KLEIN_LIBRARY: the bundled library is the one used.
    script = (
        "import klein_edge, sys\n"
        "m = klein_edge.Model(sys.argv[1], threads=2)\n"
        "image = m.generate('a small red cube', width=32, height=32, steps=2, seed=7)\n"
        "print(klein_edge.__file__)\n"
        "print(image.size, image.info['seed'], klein_edge.library_version())\n")
    env = {k: v for k, v in os.environ.items() if k not in ("KLEIN_LIBRARY", "PYTHONPATH")}
    run = tmp_path / "elsewhere"
    run.mkdir()
    done = subprocess.run([str(venv / "bin" / "python"), "-c", script, str(tiny_model)],
                          cwd=run, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    where, result = done.stdout.splitlines()
    assert where.startswith(str(venv))
    assert result.startswith("(32, 32) 7 ")


def test_a_wrong_library_path_is_named(tmp_path):
    script = ("import klein_edge\n"
              "try:\n    klein_edge.library_version()\n"
              "except OSError as e:\n    print(e)\n")
    env = dict(os.environ, KLEIN_LIBRARY=str(tmp_path / "nowhere" / "libklein.so.0"),
               PYTHONPATH=str(REPO / "python"))
    out = subprocess.check_output([sys.executable, "-c", script], env=env, text=True)
    assert "nowhere/libklein.so.0 (no such file)" in out
    assert "KLEIN_LIBRARY" in out
