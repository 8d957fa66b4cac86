"""Every error deskpod raises on purpose.

The tree::

    DeskpodError                 anything deskpod reports to a user as one line
    ├── UsageError               bad input: a value, flag, file or request that is not valid (CLI exit 2, HTTP 4xx)
    │   ├── ConfigError          an unknown key or a bad value in a config (TOML, flags, JSON body)
    │   ├── DeviceError          a device request this box cannot meet (more devices than exist, a bad index)
    │   ├── DataError            a dataset that is missing, unreadable or too corrupt to train on
    │   ├── AuthError            a missing or unknown pod-service token (HTTP 401)
    │   ├── AccessError          a valid token without the right to do this, e.g. not admin (HTTP 403)
    │   ├── NotFoundError        no such job or user, or one that belongs to another user (HTTP 404)
    │   ├── ConflictError        a request the current state refuses: a user that exists, requeueing a finished job (HTTP 409)
    │   ├── TooLargeError        a request body over the pod service's limit (HTTP 413)
    │   └── MissingExtra         a feature whose extra is not installed: names it (pip install 'deskpod[lung]')
    └── RunError                 a failure while doing valid work (CLI exit 1, HTTP 5xx)
        ├── CheckpointError      a checkpoint that is missing, corrupt, or from another model
        ├── WorkerError          a worker process failed and retries are exhausted; carries the root cause
        ├── ServiceError         the pod service is unreachable or failed (HTTP 5xx)
        └── StreamError          a video source that cannot be read: a corrupt file, a dead or refused URL

The CLI catches `DeskpodError` once, at the top, and prints ``deskpod: <message>`` on stderr.
"""

from __future__ import annotations

import importlib.util


class DeskpodError(Exception):
    """Base of every error deskpod reports to a user as one line."""

    exit_code = 1


class UsageError(DeskpodError):
    """Bad input: the message names the bad value and what is valid."""

    exit_code = 2


class ConfigError(UsageError):
    """An unknown key or a bad value in a configuration."""


class DeviceError(UsageError):
    """A device request that this machine cannot meet."""


class DataError(UsageError):
    """A dataset that is missing, unreadable, or has too many corrupt samples."""


class RunError(DeskpodError):
    """A failure while doing valid work."""

    exit_code = 1


class CheckpointError(RunError):
    """A checkpoint that is missing, corrupt, or belongs to another model.

    Asking to resume from nothing is bad input (exit 2); a damaged file is a failure (exit 1).
    """

    def __init__(self, message: str, *, usage: bool = False) -> None:
        super().__init__(message)
        if usage:
            self.exit_code = 2


class WorkerError(RunError):
    """A training worker failed and the launcher ran out of restarts.

    ``root_cause`` holds the failing worker's traceback (or the signal that killed it).
    """

    def __init__(self, message: str, root_cause: str = "") -> None:
        super().__init__(message)
        self.root_cause = root_cause


class AuthError(UsageError):
    """A request to the pod service without a valid token (HTTP 401)."""


class AccessError(UsageError):
    """A valid token that lacks the right to do this, e.g. a non-admin creating users (HTTP 403)."""


class NotFoundError(UsageError):
    """No such job or user; also what another user's job looks like to a non-admin (HTTP 404)."""


class ConflictError(UsageError):
    """A valid request that the current state refuses: a name taken, a job in a state that does not allow it (HTTP 409)."""


class TooLargeError(UsageError):
    """A request body over the pod service's size limit (HTTP 413)."""


class ServiceError(RunError):
    """The pod service could not be reached, or failed while doing valid work (HTTP 5xx)."""


class UnavailableError(ServiceError):
    """Something that is on its way but not there yet: a session still queued or starting (HTTP 503; try again)."""


class StreamError(RunError):
    """A video source that cannot be opened or decoded (a corrupt file, a URL that refuses or never answers).

    It stops that source only: an indexer of many sources reports it for that one and goes on with the others.
    ``stream`` names the source.
    """

    def __init__(self, message: str, stream: str = "") -> None:
        super().__init__(message)
        self.stream = stream


class MissingExtra(UsageError):
    """A feature whose optional libraries (an extra of pyproject.toml) are not installed; says which to install."""


EXTRAS = {
    "serve": ("onnxruntime", "onnx", "tritonclient.grpc"),
    "lung": ("SimpleITK", "pydicom", "monai", "radiomics", "scipy"),
    "video": ("av", "cv2", "dlib", "_dlib_pybind11", "face_recognition_models", "faiss", "trackers", "supervision"),
    "fleet": ("jwt", "cryptography"),
    "sessions": ("jupyterlab", "jupyter_server", "ipykernel", "jupyter_collaboration", "terminado", "websockets"),
}
"""Each extra of pyproject.toml (but ``all`` and ``dev``): the modules its libraries install (dlib-bin's wheel
declares only its compiled ``_dlib_pybind11`` as its top level, so that names it; ``dlib`` is what the code imports)."""


def require_extra(extra: str, what: str, error: type[UsageError] = MissingExtra) -> None:
    """Raise ``error`` unless every module of ``extra`` is installed (the pod refuses a job with `ConflictError`:
    a valid spec this box cannot take). The modules are found, not imported: importing monai alone takes
    seconds, and the command imports what it uses."""
    for module in EXTRAS[extra]:
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # its parent package is missing (tritonclient, for tritonclient.grpc)
            found = False
        if not found:
            raise error(f"{what} needs the {extra} extra ({module} is not installed): pip install 'deskpod[{extra}]'")
