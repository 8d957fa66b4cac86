"""deskpod: every accelerator of a box, and a cluster of boxes, for deep learning, with nothing to set up."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
