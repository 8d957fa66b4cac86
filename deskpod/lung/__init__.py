"""Lung-nodule analysis on chest CT: detect, segment, measure, grade, follow up, and evaluate.

An application on top of deskpod's trainer: images in, nodules with their measurements out, and
the LUNA16 evaluation of a detector (`deskpod.lung.evaluate`). It is decision support, not a
medical device: every report it writes says so, and nothing it prints is a diagnosis.
"""

from pathlib import Path


def phantom_reason(path: Path) -> str:
    """Why a scan is taken to be a phantom ("" when it is not): "phantom" in its path or a PHANTOM marker file."""
    resolved = path.resolve()
    if any("phantom" in part.lower() for part in resolved.parts):
        return f"'phantom' in its path ({resolved})"
    for folder in [resolved if resolved.is_dir() else resolved.parent, *resolved.parents][:4]:
        for marker in ("PHANTOM", "PHANTOM.txt", "PHANTOM.md"):
            if (folder / marker).exists():
                return f"marker file {folder / marker}"
    return ""
