"""A notebook on the pod's Slurm backend (the suite's real slurmctld + slurmd on 127.0.0.1).

The session runs where Slurm puts it and listens on the node's address (``NodeAddr``) behind a secret the pod wrote
in the job's folder; the pod forwards ``/sessions/<id>/`` there for the owner alone, adding the secret, which neither
the browser nor another user ever sees.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import stat

import httpx
import pytest

from deskpod.jobs.kinds.session import SECRET_HEADER
from tests.cluster.slurm import SlurmCluster
from tests.jobs.pods import Pods, wait_for
from tests.web.session_pods import refused
from tests.web.test_sessions import _execute, _ws_url, bearer, start_kernel

pytestmark = [pytest.mark.slow, pytest.mark.server]


def test_a_notebook_on_slurm_answers_its_owner_through_the_pod(slurm: SlurmCluster, tmp_path: os.PathLike[str]) -> None:
    pods = Pods(tmp_path)  # type: ignore[arg-type]
    try:
        pod = pods("--backend", "slurm")
        admin = pod.client()
        me = pwd.getpwuid(os.getuid()).pw_name  # a pod without accounts: its Slurm jobs are its own account's
        ann, ben = (str(admin.add_user(n, os_user=me)["token"]) for n in ("ann", "ben"))
        c = pod.client(ann)
        job = str(c.submit({"notebook": {}, "devices": 1})["id"])
        wait_for(lambda: c.job(job)["state"] == "running", 60, "the notebook to run in Slurm")
        wait_for(lambda: c.probe(f"/sessions/{job}/api/status") == 200, 60, "the notebook to answer through the pod")
        assert str(c.job(job)["external"]).isdigit()

        folder = pod.home / "jobs" / job
        where = json.loads((folder / "session.json").read_text())
        secret = (folder / "session.secret").read_text().strip()
        assert where["host"] == "127.0.0.1" and stat.S_IMODE((folder / "session.secret").stat().st_mode) == 0o600
        assert not (folder / "session.sock").exists()  # on the node's address, not a socket in the folder
        with httpx.Client(base_url=pod.url, trust_env=False, timeout=60) as http:
            page = http.get(f"/sessions/{job}/lab", headers=bearer(ann))
            assert page.status_code == 200 and secret not in page.text and secret not in str(page.headers)
            kernel = start_kernel(http, job, bearer(ann))
            for who in (ben, pod.token):  # another user, and the pod's admin
                assert http.get(f"/sessions/{job}/api/status", headers=bearer(who)).status_code == 404
        # straight to the node without the secret: refused by the session itself
        direct = httpx.get(f"http://127.0.0.1:{where['port']}/sessions/{job}/api/contents", trust_env=False)
        assert direct.status_code == 403, direct.text
        with_secret = httpx.get(f"http://127.0.0.1:{where['port']}/sessions/{job}/api/status", trust_env=False,
                                headers={SECRET_HEADER: secret})  # fmt: skip
        assert with_secret.status_code == 200, with_secret.text  # the pod's way in, not something else refusing

        url = _ws_url(pod, job, kernel)
        out = asyncio.run(_execute(url, bearer(ann), "import os; print('SLURM', os.environ['SLURM_JOB_ID'])"))
        assert out.split() == ["SLURM", str(c.job(job)["external"])], out

        assert asyncio.run(refused(url, bearer(ben))) in (4404, 403)
        c.cancel(job)
        wait_for(lambda: c.job(job)["state"] == "cancelled", 60, "the notebook to be cancelled")
        assert slurm.job(str(c.job(job)["external"]))["JobState"] == "CANCELLED"
    finally:
        pods.stop_all()
