"""One rank of ``deskpod run``: ``python -m deskpod.train.script_worker RUN_DIR``, started by the elastic agent.

It sends its stdout and stderr to ``logs/rank<R>.attempt<N>.stdout`` / ``.stderr`` (line by line, so the
launcher can follow them), applies the rank's NIC and cores, writes ``workers/rank<R>.pid`` and then runs
the user's script as ``python SCRIPT ARGS`` (or ``python -m MODULE ARGS``) would: as ``__main__``, with
``sys.argv`` and ``sys.path[0]`` as Python sets them. An exception the script raises is recorded with its
traceback for the launcher (torch elastic's error file), which reports the first failing rank's once. The
rank then ends without the interpreter's finalization (`exit_without_finalizing`), where torch's Gloo threads
can abort a process whose script succeeded.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import time
import traceback
from pathlib import Path
from types import TracebackType

from deskpod.hardware.affinity import pin_rank
from deskpod.processes import die_with_parent, exit_without_finalizing


def _output_to_logs(folder: Path, rank: int) -> None:
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    folder.mkdir(parents=True, exist_ok=True)
    for fd, stream, suffix in ((1, sys.stdout, "stdout"), (2, sys.stderr, "stderr")):
        log = open(folder / f"rank{rank}.attempt{attempt}.{suffix}", "ab")  # noqa: SIM115 - the fd keeps it
        stream.flush()
        os.dup2(log.fileno(), fd)
        log.close()
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    sys.stderr.reconfigure(line_buffering=True)  # type: ignore[union-attr]


def _run_target(target: list[str]) -> None:
    if target[0] == "-m":
        sys.argv = [target[1], *target[2:]]
        sys.path.insert(0, os.getcwd())
        runpy.run_module(target[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(target)
        sys.path.insert(0, str(Path(target[0]).parent))
        runpy.run_path(target[0], run_name="__main__")


def _users_traceback(e: BaseException) -> str:
    """The traceback as Python would print it for ``python SCRIPT``: from the script's first frame on,
    without this wrapper's and runpy's frames."""
    tb: TracebackType | None = e.__traceback__
    mine = {__file__, runpy.__file__}
    while tb is not None and (
        tb.tb_frame.f_code.co_filename in mine or tb.tb_frame.f_code.co_filename.startswith("<frozen")
    ):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(e), e, tb or e.__traceback__))


def _record(e: BaseException) -> None:
    """Write the failure where torch elastic's agent looks for it (the format of its ``record``), so the
    launcher can report this rank's traceback once, and print it to this rank's stderr as Python would."""
    text = _users_traceback(e)
    sys.stderr.write(text)
    sys.stderr.flush()
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if path:
        doc = {"message": {"message": f"{type(e).__name__}: {e}",
                           "extraInfo": {"py_callstack": text, "timestamp": str(int(time.time()))}}}  # fmt: skip
        Path(path).write_text(json.dumps(doc))


def main() -> None:
    run_dir = Path(sys.argv[1])
    die_with_parent()
    launch = json.loads((run_dir / "run.json").read_text())
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    _output_to_logs(run_dir / "logs", rank)
    pids = run_dir / "workers"
    pids.mkdir(exist_ok=True)
    (pids / f"rank{rank}.pid").write_text(str(os.getpid()))
    pin_rank(launch.get("affinity", {}).get(str(local_rank)))
    sys.path.pop(0)  # this module's folder: the script gets the path `python SCRIPT` would give it
    try:
        _run_target(list(launch["target"]))
    except SystemExit as e:
        exit_without_finalizing(_exit_status(e.code))
    except BaseException as e:  # KeyboardInterrupt included: the script's failure, reported as its own
        _record(e)
        exit_without_finalizing(1)
    exit_without_finalizing(0)


def _exit_status(code: object) -> int:
    """The exit status Python gives ``sys.exit(code)``: None is 0, an int is itself, anything else is printed
    to stderr and is 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    main()
