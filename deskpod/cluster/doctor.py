"""``deskpod doctor --cluster``: can this machine run deskpod's jobs on its Slurm cluster?

One line per check, pass / warn / fail / skip with a one-line detail, in the order a person would look:

- ``clients``: sbatch, srun, squeue, scontrol, scancel and sinfo on PATH;
- ``config``: the slurm.conf the clients read (``SLURM_CONF`` pointing nowhere would make every client
  retry for 60 s, so it fails here at once);
- ``version``: ``sbatch --version``, what deskpod asks GPUs with on it (`slurm.gpu_options`), then one
  ``known bug`` line per bug of `KNOWN_BUGS` in that version: pass when deskpod avoids it, warn when it
  can hit deskpod's jobs;
- ``controller``: ``scontrol ping``; when it fails, the checks that need the controller are skipped;
- ``munge``: a ``munge -n | unmunge`` round trip (when AuthType is auth/munge);
- ``partitions`` and ``gpu gres``: ``sinfo``: nodes, their states, GPUs per node;
- ``squeue json`` and ``scontrol text``: whether ``squeue --json`` works here (its serializer plugin) and
  deskpod reads it, and the text deskpod reads jobs from on every version (``scontrol show job -o``);
- ``sacct``: accounting (slurmdbd); without it deskpod sees a job only until ``MinJobAge`` after its end;
- ``node names``: the partitions' node names resolve here (``scontrol show hostnames`` +
  ``getaddrinfo``): the rendezvous address of a multi-node job is the first node's name.

Every Slurm command runs under ``timeout`` seconds, so an unreachable controller costs seconds.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import asdict, dataclass, field
from pathlib import Path

from deskpod.cluster import slurm
from deskpod.cluster.slurm import Version
from deskpod.errors import DeskpodError
from deskpod.hardware.doctor import Status

DEFAULT_CONF = Path("/etc/slurm/slurm.conf")
"""Where Debian's Slurm (and SchedMD's default ``--sysconfdir``) looks without ``SLURM_CONF``."""
MAX_RESOLVED = 64
"""Node names resolved at most (a big cluster's names are checked on a sample, the first ones)."""


@dataclass(frozen=True, slots=True)
class ClusterCheck:
    """One line of the report."""

    name: str
    status: Status
    detail: str
    source: str = ""
    """Where a known bug is documented (SchedMD changelog, commit, ticket)."""


@dataclass(slots=True)
class ClusterReport:
    checks: list[ClusterCheck] = field(default_factory=list)
    version: str | None = None
    """Slurm's version, when ``sbatch --version`` answered."""
    elapsed_s: float = 0.0

    @property
    def failed(self) -> bool:
        return any(c.status == "fail" for c in self.checks)

    def check(self, name: str) -> ClusterCheck:
        """The first check of this name."""
        found = next((c for c in self.checks if c.name == name), None)
        if found is None:
            raise KeyError(f"no check {name!r}; checks: {', '.join(c.name for c in self.checks)}")
        return found

    def to_json(self) -> str:
        return json.dumps(
            {
                "schema": "deskpod.doctor.cluster/1",
                "ok": not self.failed,
                "slurm_version": self.version,
                "elapsed_s": round(self.elapsed_s, 3),
                "checks": [asdict(c) for c in self.checks],
            },
            indent=2,
        )

    def to_table(self) -> str:
        rows = [("check", "status", "detail")] + [(c.name, c.status.upper(), c.detail) for c in self.checks]
        widths = [max(len(r[i]) for r in rows) for i in range(2)]
        lines = [f"{r[0].ljust(widths[0])}  {r[1].ljust(widths[1])}  {r[2]}" for r in rows]
        counts = {s: sum(c.status == s for c in self.checks) for s in ("fail", "warn", "skip")}
        verdict = "FAIL" if self.failed else "OK"
        what = f"Slurm {self.version}" if self.version else "no Slurm version"
        lines.append(
            f"{verdict}: {len(self.checks)} checks ({counts['fail']} failed, {counts['warn']} warnings, "
            f"{counts['skip']} skipped), {what}, in {self.elapsed_s:.1f} s"
        )
        return "\n".join(lines)


# ---------------------------------------------------------------- known bugs
Exposure = Callable[[Mapping[str, str]], tuple[bool | None, str]]
"""Whether deskpod's jobs can hit a bug, given ``scontrol show config`` ({} when unknown), and why not:
(True, ''), (False, why) or (None, why: cannot tell)."""


@dataclass(frozen=True, slots=True)
class KnownBug:
    """A Slurm bug that touches what deskpod asks Slurm for, in versions ``first`` <= v < ``fixed``."""

    first: Version | None
    """The first version with it (None: every version before ``fixed`` whose source was read has it)."""
    fixed: Version
    what: str
    deskpod: str
    """What deskpod does about it, or what the user should."""
    source: str
    exposed: Exposure

    def applies(self, v: Version) -> bool:
        return (self.first is None or self.first <= v) and v < self.fixed

    def versions(self) -> str:
        return f"since {self.first}, fixed in {self.fixed}" if self.first else f"fixed in {self.fixed}"


def _avoided(config: Mapping[str, str]) -> tuple[bool | None, str]:
    return False, ""


def _always(config: Mapping[str, str]) -> tuple[bool | None, str]:
    return True, ""


def _extern_step(config: Mapping[str, str]) -> tuple[bool | None, str]:
    """An extern step exists with ``PrologFlags=Contain`` (X11 implies it) or slurmctld's step manager."""
    if not config:
        return None, "cannot tell without the controller's configuration (PrologFlags)"
    flags, params = config.get("PrologFlags", ""), config.get("SlurmctldParameters", "")
    if "contain" in flags.lower() or "x11" in flags.lower() or "enable_stepmgr" in params.lower():
        return True, ""
    return False, f"not exposed here: no extern step (PrologFlags={flags or '(null)'})"


KNOWN_BUGS: tuple[KnownBug, ...] = (
    KnownBug(
        *slurm.NTASKS_PER_NODE_BUG,
        what='jobs asking for --ntasks-per-node may be refused ("Requested node configuration is not available")',
        deskpod="deskpod asks for --ntasks=N with --gpus-per-task=G instead (gpu_options); one task per node "
        "keeps all G GPUs of its node visible to that task",
        # CHANGELOG/slurm-22.05.md, 22.05.9: "Fix regression in 22.05.5 that causes some jobs that request
        # --ntasks-per-node to be incorrectly rejected." Fix: commit 3b8302ed63 (SchedMD bug 15857), regression
        # from 49826b9264 (bug 15153, 22.05.5). --gpus-per-task implies --gpu-bind=per_task since 21.08.0rc1 (NEWS).
        source="https://github.com/SchedMD/slurm/blob/master/CHANGELOG/slurm-22.05.md (22.05.9); SchedMD bug 15857",
        exposed=_avoided,
    ),
    KnownBug(
        Version(22, 5, 7),
        Version(22, 5, 9),
        what="slurmctld cannot reach an srun started on a host that is not a configured Slurm node (or whose "
        "hostname only aliases its NodeHostname): the step does not start",
        deskpod="deskpod submit runs srun inside its batch script, on a node (safe); run deskpod train --nodes "
        "inside sbatch or on a node, not in an salloc shell on a login node",
        # CHANGELOG/slurm-22.05.md, 22.05.9: "srun - fix regression in 22.05.7 that prevented slurmctld from
        # connecting to an srun running outside of a compute node." Fix: commit a5fa2ad707 (SchedMD bug 16401),
        # regression from 11712ce709 (bug 15557).
        source="https://github.com/SchedMD/slurm/blob/master/CHANGELOG/slurm-22.05.md (22.05.9); SchedMD bug 16401",
        exposed=_always,
    ),
    KnownBug(
        Version(21, 8),
        Version(24, 5, 1),
        what="squeue --json ignores its filters (--jobs, --user, --states, --me) and answers every job",
        deskpod="deskpod reads jobs from scontrol show job -o and filters them itself; only the JSON probe "
        "pays for the whole queue",
        # CHANGELOG/slurm-24.05.md, 24.05.1: "Fix filtering arguments being ignored when using squeue --json."
        # Commit ff14834caa (ticket 19482). Seen on 22.05.8 here: tests/cluster/data/README.md.
        source="https://github.com/SchedMD/slurm/blob/master/CHANGELOG/slurm-24.05.md (24.05.1); SchedMD ticket 19482",
        exposed=_avoided,
    ),
    KnownBug(
        None,
        Version(24, 11, 6),
        what="a --signal without B: also reaches the extern step's placeholder process, which dies and ends the "
        "extern step (pam_slurm_adopt and X11 break; with the step manager the job fails)",
        deskpod="deskpod's jobs ask for --signal=USR2@T before their time limit: on this cluster set "
        "signal_before_s = 0 in the job's [slurm] table (the job then relies on its periodic checkpoints)",
        # CHANGELOG/slurm-24.11.md, 24.11.6: "Fix incorrect extern step termination when using sbatch or salloc
        # --signal option." Commit d44d2096b9 (ticket 22690). Older: 22.05.8's slurmd signals every step but the
        # batch script (_kill_all_active_steps in src/slurmd/slurmd/req.c) and the extern step runs the same
        # "sleep 100000000" (src/slurmd/slurmstepd/mgr.c); 25.05 has no such process.
        source="https://github.com/SchedMD/slurm/blob/master/CHANGELOG/slurm-24.11.md (24.11.6); SchedMD ticket 22690",
        exposed=_extern_step,
    ),
)


def bug_checks(v: Version, config: Mapping[str, str]) -> list[ClusterCheck]:
    """One ``known bug`` line per bug of this version: pass when deskpod avoids it or is not exposed here,
    warn when it can hit deskpod's jobs (or the doctor cannot tell)."""
    out = []
    for bug in KNOWN_BUGS:
        if not bug.applies(v):
            continue
        exposed, why = bug.exposed(config)
        if exposed is None:
            why = f"{why}; {bug.deskpod}"
        status: Status = "pass" if exposed is False else "warn"
        detail = f"{bug.versions()}: {bug.what}; {why or bug.deskpod}"
        out.append(ClusterCheck("known bug", status, detail, bug.source))
    return out


# ---------------------------------------------------------------- the checks
def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """One Slurm client; no answer in ``timeout`` seconds is exit code 124 with Slurm's one-line message."""
    try:
        return slurm.run(argv, timeout=timeout, check=False)
    except slurm.SlurmError as e:
        return subprocess.CompletedProcess(argv, 124, "", str(e))


def _first_line(done: subprocess.CompletedProcess[str]) -> str:
    """What a failed Slurm command said: its error lines, else its first line of output, else its exit code."""
    out = done.stdout.strip().splitlines()
    return slurm.message(done.stderr) or (out[0] if out else f"exit code {done.returncode}")


def check_clients() -> ClusterCheck:
    found = {t: shutil.which(t) for t in slurm.TOOLS}
    missing = [t for t, p in found.items() if p is None]
    if missing:
        return ClusterCheck(
            "clients", "fail", f"no Slurm on this machine: {', '.join(missing)} not on PATH; run this on a login node "
            "of a Slurm cluster (or install Slurm's clients: apt-get install slurm-client)"
        )  # fmt: skip
    folders = sorted({str(Path(p).parent) for p in found.values() if p})
    return ClusterCheck("clients", "pass", f"{', '.join(slurm.TOOLS)} in {', '.join(folders)}")


def check_config(environ: Mapping[str, str]) -> ClusterCheck:
    conf = environ.get("SLURM_CONF")
    if conf:
        if not Path(conf).is_file():
            return ClusterCheck(
                "config", "fail", f"SLURM_CONF={conf}: no such file (Slurm's clients would retry it for 60 s); "
                "point SLURM_CONF at the cluster's slurm.conf or unset it"
            )  # fmt: skip
        return ClusterCheck("config", "pass", f"SLURM_CONF={conf}")
    if DEFAULT_CONF.is_file():
        return ClusterCheck("config", "pass", f"{DEFAULT_CONF} (SLURM_CONF is not set)")
    return ClusterCheck(
        "config", "warn", f"SLURM_CONF is not set and {DEFAULT_CONF} does not exist: the clients will look for a "
        "configless controller (DNS SRV record _slurmctld._tcp)"
    )  # fmt: skip


def check_version(timeout: float) -> tuple[ClusterCheck, Version | None]:
    done = _run(["sbatch", "--version"], timeout)
    if done.returncode != 0:
        return ClusterCheck("version", "fail", f"sbatch --version failed: {_first_line(done)}"), None
    try:
        v = slurm.parse_version(done.stdout)
    except slurm.SlurmError as e:
        return ClusterCheck("version", "fail", str(e)), None
    asks = " ".join(["--nodes=N", "--ntasks=N", *slurm.gpu_options(v, 8)]).replace("=8", "=G")
    return ClusterCheck("version", "pass", f"{done.stdout.strip()}; deskpod asks for N nodes of G GPUs with {asks}"), v


def check_controller(timeout: float) -> ClusterCheck:
    done = _run(["scontrol", "ping"], timeout)
    said = [ln.strip() for ln in done.stdout.splitlines() if " at " in ln]  # Slurmctld(primary) at HOST is UP
    if done.returncode == 0 and said and all(ln.endswith(" is UP") for ln in said):
        return ClusterCheck("controller", "pass", "; ".join(said))
    why = "; ".join(said) or slurm.message(done.stderr) or f"scontrol ping: exit code {done.returncode}"
    prefix = "" if why.startswith("the Slurm controller is unreachable") else "the Slurm controller is unreachable: "
    return ClusterCheck("controller", "fail", prefix + why)


def read_config(timeout: float) -> dict[str, str]:
    """``scontrol show config`` ({} when it does not answer)."""
    done = _run(["scontrol", "show", "config"], timeout)
    return slurm.parse_config(done.stdout) if done.returncode == 0 else {}


def check_munge(config: Mapping[str, str], timeout: float) -> ClusterCheck:
    auth = config.get("AuthType", "")
    if auth and "munge" not in auth:
        return ClusterCheck("munge", "skip", f"AuthType={auth}: this cluster does not use munge")
    munge, unmunge = shutil.which("munge"), shutil.which("unmunge")
    if munge is None or unmunge is None:
        return ClusterCheck(
            "munge", "warn", "munge/unmunge are not on PATH: cannot test a credential round trip here "
            "(Slurm's clients use libmunge directly; apt-get install munge adds the tools)"
        )  # fmt: skip
    try:
        cred = subprocess.run([munge, "-n"], capture_output=True, text=True, timeout=timeout)
        back = subprocess.run([unmunge], capture_output=True, text=True, timeout=timeout, input=cred.stdout)
    except subprocess.TimeoutExpired:
        return ClusterCheck("munge", "fail", f"munge -n | unmunge did not answer in {timeout:g} s (is munged running?)")
    if cred.returncode != 0 or back.returncode != 0:
        why = (cred.stderr if cred.returncode != 0 else back.stderr).strip().splitlines()
        return ClusterCheck("munge", "fail", f"munge -n | unmunge failed: {why[0] if why else 'no message'} "
                            "(is munged running, with the cluster's key?)")  # fmt: skip
    fields = dict(ln.split(":", 1) for ln in back.stdout.splitlines() if ":" in ln)
    status = " ".join(fields.get("STATUS", "").split())
    host = " ".join(fields.get("ENCODE_HOST", "").split())
    return ClusterCheck(
        "munge", "pass", f"munge -n | unmunge: {status or 'ok'}" + (f", encoded on {host}" if host else "")
    )


def check_partitions(timeout: float) -> tuple[list[ClusterCheck], list[str]]:
    """``partitions`` and ``gpu gres``, and the partitions' node lists (for ``node names``)."""
    done = _run(["sinfo", "-h", "-N", "-o", slurm.PARTITION_FORMAT], timeout)
    if done.returncode != 0:
        fail = ClusterCheck("partitions", "fail", f"sinfo failed: {_first_line(done)}")
        return [fail, ClusterCheck("gpu gres", "skip", "needs sinfo")], []
    parts = sorted(slurm.parse_partitions(done.stdout), key=lambda p: (not p.default, p.name))  # the default first
    if not parts:
        none = ClusterCheck("partitions", "fail", "sinfo shows no partition: this cluster has nowhere to run jobs")
        return [none, ClusterCheck("gpu gres", "skip", "no partition")], []
    states = _run(["sinfo", "-h", "-o", "%R|%D|%t|%N"], timeout)
    by: dict[str, list[str]] = {}
    lists: list[str] = []
    for line in states.stdout.splitlines():
        bits = line.strip().split("|")
        if len(bits) == 4:
            by.setdefault(bits[0], []).append(f"{bits[1]} {bits[2]}")
            lists.append(bits[3])
    described, down = [], []
    for p in parts:
        flag = " (default)" if p.default else ""
        described.append(
            f"{p.name}{flag}: {p.nodes} node{'s' * (p.nodes != 1)} {p.state}, {', '.join(by.get(p.name, []))}"
        )
        if p.state != "up":
            down.append(p.name)
    status: Status = "warn" if down else "pass"
    detail = "; ".join(described) + (f"; not up: {', '.join(down)}" if down else "")
    gpus = [p for p in parts if p.gpus_per_node]
    if gpus:
        gres = ClusterCheck(
            "gpu gres", "pass", "; ".join(f"{p.name}: {p.nodes} node{'s' * (p.nodes != 1)}, up to {p.gpus_per_node} "
                                          f"GPUs per node" for p in gpus)
        )  # fmt: skip
    else:
        gres = ClusterCheck(
            "gpu gres", "warn", "no node has GPU GRES (sinfo %G shows no gpu:N): deskpod asks for CPUs only "
            "(--cpus-per-task); GPU jobs need GresTypes=gpu and Gres=gpu:N on the node lines"
        )  # fmt: skip
    return [ClusterCheck("partitions", status, detail), gres], sorted(set(lists))


def check_squeue_json(timeout: float) -> ClusterCheck:
    done = _run(["squeue", "--json", "--me"], timeout)
    if not done.stdout.lstrip().startswith("{"):
        return ClusterCheck(
            "squeue json", "warn", f"squeue --json is not available here ({_first_line(done)}): deskpod reads "
            "scontrol show job -o text instead, on every version"
        )  # fmt: skip
    try:
        data = json.loads(done.stdout)
        meta = data.get("meta", {})
        plugin = meta.get("plugin") or meta.get("plugins") or {}
        parser = plugin.get("data_parser") or plugin.get("type") or "?"
        read = slurm.parse_squeue_json(done.stdout)
    except (ValueError, AttributeError, TypeError, DeskpodError) as e:
        return ClusterCheck(
            "squeue json", "warn", f"squeue --json answers, but deskpod cannot read it ({e}): it reads "
            "scontrol show job -o text instead"
        )  # fmt: skip
    return ClusterCheck("squeue json", "pass", f"squeue --json works ({parser}): {len(read)} job(s) read")


def check_scontrol_text(timeout: float) -> ClusterCheck:
    done = _run(["scontrol", "show", "job", "-o"], timeout)
    if done.returncode != 0 and "no jobs in the system" not in (done.stdout + done.stderr).lower():
        return ClusterCheck("scontrol text", "fail", f"scontrol show job -o failed: {_first_line(done)}")
    found = slurm.parse_scontrol_jobs(done.stdout)
    states = sorted({j.state.split()[0] for j in found})
    try:
        for j in found:
            slurm.deskpod_state(j.state)
    except slurm.SlurmError as e:
        return ClusterCheck("scontrol text", "warn", f"scontrol show job -o: {e}")
    what = f"{len(found)} job(s)" + (f" ({', '.join(states)})" if states else "")
    return ClusterCheck(
        "scontrol text", "pass", f"scontrol show job -o: {what} read; this is what deskpod reads jobs from"
    )


def _seconds(value: str) -> int | None:
    first = value.split()[0] if value.split() else ""
    return int(first) if first.isdigit() else None


def check_sacct(config: Mapping[str, str], timeout: float) -> ClusterCheck:
    age = _seconds(config.get("MinJobAge", ""))
    forget = (
        f"scontrol show job, which forgets a job MinJobAge={age} s after it ends" if age is not None
        else "scontrol show job, which forgets a job MinJobAge seconds after it ends (MinJobAge unknown)"
    )  # fmt: skip
    storage = config.get("AccountingStorageType", "")
    if shutil.which("sacct") is None:
        return ClusterCheck("sacct", "warn", f"sacct is not on PATH: deskpod reads {forget}")
    if storage.endswith("/none"):
        return ClusterCheck("sacct", "warn", f"no accounting (AccountingStorageType={storage}): deskpod reads {forget}")
    done = _run(["sacct", "-n", "-X", "-j", "1", "-o", "JobID"], timeout)
    said = slurm.message(done.stderr)
    if done.returncode != 0 or "disabled" in said.lower():
        return ClusterCheck("sacct", "warn", f"sacct does not work ({said or f'exit code {done.returncode}'}): "
                            f"deskpod reads {forget}")  # fmt: skip
    js = _run(["sacct", "--json", "-j", "1"], timeout)
    json_ok = js.returncode == 0 and js.stdout.lstrip().startswith("{")
    return ClusterCheck("sacct", "pass", f"sacct works ({storage or 'accounting on'}); sacct --json "
                        f"{'works' if json_ok else 'is not available: text only'}")  # fmt: skip


def check_node_names(nodelists: list[str], timeout: float) -> ClusterCheck:
    names: list[str] = []
    for nodelist in nodelists:
        done = _run(["scontrol", "show", "hostnames", nodelist], timeout)
        if done.returncode != 0:
            return ClusterCheck("node names", "fail", f"scontrol show hostnames {nodelist} failed: {_first_line(done)}")
        names += [n for n in done.stdout.split() if n not in names]
    if not names:
        return ClusterCheck("node names", "skip", "no nodes")
    sample = names[:MAX_RESOLVED]
    pool = ThreadPoolExecutor(max_workers=min(16, len(sample)))
    futures = {n: pool.submit(socket.getaddrinfo, n, None, socket.AF_INET, socket.SOCK_STREAM) for n in sample}
    resolved: dict[str, str] = {}
    bad: list[str] = []
    deadline = time.monotonic() + timeout
    for n, fut in futures.items():
        try:
            resolved[n] = str(fut.result(timeout=max(0.0, deadline - time.monotonic()))[0][4][0])
        except FutureTimeout:
            bad.append(f"{n} (no answer in {timeout:g} s)")
        except OSError as e:
            bad.append(f"{n} ({e.strerror or e})")
    pool.shutdown(wait=False, cancel_futures=True)
    of = f" (the first {len(sample)} of {len(names)})" if len(names) > len(sample) else ""
    if bad:
        return ClusterCheck(
            "node names", "fail", f"{', '.join(bad)} do not resolve{of}: multi-node jobs find their first node by "
            "name; add them to DNS or /etc/hosts"
        )  # fmt: skip
    addresses = sorted(set(resolved.values()))
    return ClusterCheck("node names", "pass", f"{', '.join(sample)}{of} resolve ({', '.join(addresses)})")


def check_cluster(*, timeout: float = 20.0) -> ClusterReport:
    """Every cluster check, from this machine (the login node deskpod submits from)."""
    start = time.perf_counter()
    report = ClusterReport()
    add = report.checks.append
    clients = check_clients()
    add(clients)
    config_file = check_config(os.environ) if clients.status == "pass" else ClusterCheck("config", "skip", "no clients")
    add(config_file)
    if clients.status == "fail" or config_file.status == "fail":
        why = "no Slurm clients" if clients.status == "fail" else "no slurm.conf"
        for name in ("version", "controller"):
            add(ClusterCheck(name, "skip", f"needs Slurm's clients and configuration ({why})"))
        add(check_munge({}, timeout))
        for name in ("partitions", "gpu gres", "squeue json", "scontrol text", "sacct", "node names"):
            add(ClusterCheck(name, "skip", f"needs Slurm's clients and configuration ({why})"))
        report.elapsed_s = time.perf_counter() - start
        return report

    version_check, version = check_version(timeout)
    add(version_check)
    report.version = str(version) if version else None
    controller = check_controller(timeout)
    up = controller.status == "pass"
    config = read_config(timeout) if up else {}
    if version is not None:
        report.checks.extend(bug_checks(version, config))
    add(controller)
    add(check_munge(config, timeout))
    if up:
        part_checks, nodelists = check_partitions(timeout)
        report.checks.extend(part_checks)
        add(check_squeue_json(timeout))
        add(check_scontrol_text(timeout))
    else:
        for name in ("partitions", "gpu gres", "squeue json", "scontrol text"):
            add(ClusterCheck(name, "skip", "needs the controller (unreachable)"))
        nodelists = []
    add(check_sacct(config, timeout))
    if up:
        add(check_node_names(nodelists, timeout))
    else:
        add(ClusterCheck("node names", "skip", "needs the controller (unreachable)"))
    report.elapsed_s = time.perf_counter() - start
    return report
