"""The klein_edge Python package: `pip install ./python` from the repository root.

The package is pure Python over the C library (libklein.so.0). When the repository's build
(../build, or the file KLEIN_LIBRARY names) has the library, a copy goes into the package, so
the installed package works without the build tree; otherwise the package looks for the
library at run time (KLEIN_LIBRARY, then the system's library path, where the Debian package
installs it).
"""
import os
import pathlib
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = pathlib.Path(__file__).resolve().parent


def built_library():
    given = os.environ.get("KLEIN_LIBRARY")
    if given:
        path = pathlib.Path(given)
        if not path.is_file():
            raise SystemExit(f"KLEIN_LIBRARY={given}: no such file")
        return path
    path = HERE.parent / "build" / "libklein.so.0"
    return path if path.exists() else None


class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        library = built_library()
        if library is None:
            print("klein_edge: no built libklein.so.0 found (../build or KLEIN_LIBRARY); "
                  "the package will use the system's")
            return
        target = pathlib.Path(self.build_lib) / "klein_edge" / "libklein.so.0"
        shutil.copyfile(library.resolve(), target)
        print(f"klein_edge: bundled {library.resolve()}")


setup(
    name="klein-edge",
    version="0.1.0",
    description="FLUX.2-klein and Z-Image image generation on the CPU (Klein Edge's C library)",
    license="Apache-2.0",
    packages=["klein_edge"],
    python_requires=">=3.9",
    install_requires=["Pillow"],
    cmdclass={"build_py": BuildWithLibrary},
    zip_safe=False,
)
