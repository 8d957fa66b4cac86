"""The two real chest CTs (lung1, lung2) with lesion masks, from the pyradiomics-bhklab 3.1.4 source distribution.

`lung_data()` returns the folder holding ``lung{1,2}_{image,label}.nrrd`` and ``baseline/``: ``$DESKPOD_LUNG_DATA``
when set, else ``~/.cache/deskpod/pyradiomics-bhklab-3.1.4/data``, downloaded once (sha256 checked, only
``data/lung*`` and ``data/baseline/*`` extracted into a temporary folder that is then renamed into place).
The test is skipped, with the reason, only when the download itself fails (no network).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import tempfile
import urllib.request
from pathlib import Path

import pytest

URL = (
    "https://files.pythonhosted.org/packages/32/fa/f537d03512335d6f9ba4e1678679a845bc2e73c9d9c1ddbe666909e10c14/"
    "pyradiomics_bhklab-3.1.4.tar.gz"
)
SHA256 = "a44a087efc4ede91b5dfa5cf0de58ea3596bfaec1ef2484f278504b0a8fd5ffb"
PREFIX = "pyradiomics_bhklab-3.1.4/data/"
FILES = ("lung1_image.nrrd", "lung1_label.nrrd", "lung2_image.nrrd", "lung2_label.nrrd")


def lung_data() -> Path:
    """The data folder with lung1/lung2 and baseline/, downloading it on first use."""
    env = os.environ.get("DESKPOD_LUNG_DATA")
    if env:
        return Path(env)
    target = Path.home() / ".cache" / "deskpod" / "pyradiomics-bhklab-3.1.4" / "data"
    if all((target / name).is_file() for name in FILES):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        archive = Path(tmp) / "sdist.tar.gz"
        try:
            with urllib.request.urlopen(URL, timeout=60) as response, archive.open("wb") as out:
                shutil.copyfileobj(response, out)
        except OSError as err:
            pytest.skip(f"cannot download the lung CTs ({URL}): {err}")
        digest = hashlib.sha256(archive.read_bytes()).hexdigest()
        if digest != SHA256:
            raise AssertionError(f"{URL}: sha256 {digest}, expected {SHA256}")
        staged = Path(tmp) / "data"
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                rel = member.name[len(PREFIX) :] if member.name.startswith(PREFIX) else ""
                if member.isfile() and (rel.startswith("lung") or rel.startswith("baseline/")):
                    dest = staged / rel
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    source = tar.extractfile(member)
                    assert source is not None
                    with source, dest.open("wb") as out:
                        shutil.copyfileobj(source, out)
        if not target.exists():
            try:
                staged.rename(target)
            except OSError:
                if not target.exists():  # another test process won the race: theirs is as good
                    raise
    return target
