"""The process the launcher starts once per device: ``python -m deskpod.train.worker RUN_DIR``.

It sets its device (a GPU, or a CPU slot's thread count), joins the process group the elastic
agent's rendezvous prepared (NCCL on GPUs, Gloo on CPUs, with the configured timeout so a stalled
collective fails instead of hanging), and runs the `Trainer`. ``@record`` writes an uncaught
exception's traceback to the error file the agent reads, so the launcher can name the root cause.

Bad input found only here (for example a corrupt-image limit, or a model that fails on the data)
is written to ``RUN_DIR/error.json`` and the worker exits 0: restarting cannot fix bad input, and the
launcher turns the file into a one-line error with exit code 2.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from deskpod.environment.files import write_json
from deskpod.errors import UsageError
from deskpod.hardware.affinity import pin_rank
from deskpod.processes import die_with_parent, exit_without_finalizing
from deskpod.train.runs import RunPaths, read_json


def _stderr_to_log(folder: Path, rank: int) -> None:
    """Send this worker's stderr to ``logs/rank<R>.attempt<N>.stderr``.

    A failing group would otherwise print every rank's traceback on every attempt; the launcher
    prints the root cause once. (torch elastic's own ``redirects`` leaks the log files' handles in
    the launching process, which matters when it launches many times, as ``bench train`` does.)
    """
    folder.mkdir(exist_ok=True)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    log = open(folder / f"rank{rank}.attempt{attempt}.stderr", "ab")  # noqa: SIM115 - fd 2 keeps it for the process
    sys.stderr.flush()
    os.dup2(log.fileno(), 2)


@record
def main(argv: list[str] | None = None) -> int:
    from deskpod.train.trainer import StopFlag, Trainer

    args = sys.argv[1:] if argv is None else argv
    run_dir = Path(args[0])
    paths = RunPaths(run_dir)
    stop = StopFlag()
    stop.install()
    die_with_parent()
    launch = read_json(paths.launch)
    local_rank = int(os.environ["LOCAL_RANK"])
    rank = int(os.environ["RANK"])
    pid_dir = run_dir / "workers"
    pid_dir.mkdir(exist_ok=True)
    (pid_dir / f"rank{rank}.pid").write_text(str(os.getpid()))
    _stderr_to_log(run_dir / "logs", rank)
    pin_rank(launch.get("affinity", {}).get(str(local_rank)))
    if launch["kind"] == "cuda":
        torch.cuda.set_device(local_rank)
        backend = "nccl"
    else:
        torch.set_num_threads(int(launch["threads"]))
        backend = "gloo"
    timeout = timedelta(seconds=float(launch["collective_timeout_s"]))
    kwargs = {"device_id": torch.device("cuda", local_rank)} if backend == "nccl" else {}
    dist.init_process_group(backend, timeout=timeout, **kwargs)  # type: ignore[arg-type]
    try:
        result = Trainer(run_dir, stop).run()
        result["restarts"] = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        if rank == 0:
            write_json(run_dir / "worker-result.json", result, indent=2)
    except UsageError as e:
        write_json(run_dir / "error.json", {"type": type(e).__name__, "message": str(e), "rank": rank}, indent=2)
        return 0
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    exit_without_finalizing(main())
