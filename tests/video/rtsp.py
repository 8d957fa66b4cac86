"""A live RTSP stream on 127.0.0.1: Debian's rtsp-server-perl relays what ffmpeg pushes to it (``-re
-stream_loop -1``: a clip in a loop at its own pace). ffmpeg 5.1 cannot itself serve RTSP to a client (its
``-rtsp_flags listen`` is for receiving), hence the relay; the relay hands clients RTP over UDP."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import BinaryIO

import pytest

from tests.popen import stop_popen


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RtspStream:
    """``url`` serves ``clip`` while started; `stop` and `start` again to drop and bring back the stream."""

    def __init__(self, clip: Path, log: Path) -> None:
        for tool in ("ffmpeg", "rtsp-server-perl"):
            if shutil.which(tool) is None:
                pytest.skip(f"{tool} is missing: apt-get install -y ffmpeg rtsp-server-perl")
        self.clip, self.log = clip, log
        self.client_port, self.source_port = free_port(), free_port()
        self.url = f"rtsp://127.0.0.1:{self.client_port}/cam"
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> RtspStream:
        with self.log.open("ab") as out:
            self._start(out)
        return self

    def _start(self, out: BinaryIO) -> None:
        server = subprocess.Popen(
            ["rtsp-server-perl", "--clientport", str(self.client_port), "--serverport", str(self.source_port),
             "--client_listen_address", "127.0.0.1", "--source_listen_address", "127.0.0.1",
             "--rtp_start_port", str(20000 + self.client_port % 20000)],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.procs.append(server)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.source_port)) == 0:
                    break
            time.sleep(0.1)
        push = subprocess.Popen(
            ["ffmpeg", "-nostdin", "-loglevel", "error", "-re", "-stream_loop", "-1", "-i", str(self.clip),
             "-an", "-c:v", "libx264", "-preset", "ultrafast", "-tune", "zerolatency", "-g", "10",
             "-f", "rtsp", f"rtsp://127.0.0.1:{self.source_port}/cam"],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.procs.append(push)
        time.sleep(1.0)

    def stop(self) -> None:
        for p in reversed(self.procs):
            stop_popen(p, 5)
        self.procs.clear()
