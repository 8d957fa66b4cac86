"""Decode: deskpod's ingest against ``ffmpeg -threads N -i clip -f null -``, same clip, same threads, one run.

    .venv/bin/python benchmarks/bench_video_decode.py               # table + JSON, updates docs/benchmarks.md
    .venv/bin/python benchmarks/bench_video_decode.py --no-docs --repeat 1     # a quick look

deskpod's side is what ``deskpod video index`` runs for a file, `deskpod.video.sources.read` at the default
``--fps 5``: PyAV (FFmpeg's libraries in the av wheel) decodes every frame with frame threads and converts the
sampled ones to BGR. Its frames/s is the clip's frames (all decoded) over the wall time. The reference is Debian's
ffmpeg CLI decoding the same clip to the null muxer with ``-threads N`` (its own FFmpeg build, 5.1 here; the
wheel's is newer); its frames/s is the same frame count over its wall time, process start included (~0.05 s,
measured by ``ffmpeg -version``, and subtracted). Each is the median of ``--repeat`` runs after one untimed warm
run. Checked outside the timing: deskpod decoded as many frames as ffprobe counts, and sampled the number that
5 fps predicts. Target: deskpod >= 0.9x ffmpeg's frames/s at every thread count.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from docs_section import cpu_model, publish

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from deskpod.video.sources import expand_sources, read  # noqa: E402
from tests.video.clips import find  # noqa: E402

SECTION = "## Video"
SUB = "### Decode against the ffmpeg CLI (bench_video_decode.py)"
INTRO = "Video analytics (`deskpod video`, docs/video.md) on the real clips of tests/video/clips.py."
TARGET = 0.9
FPS = 5.0


def frame_count(path: Path) -> tuple[int, float]:
    """Frames in the clip's video stream (ffprobe decodes and counts them) and its frame rate."""
    out = subprocess.run(["ffprobe", "-v", "error", "-select_streams", "v:0", "-count_frames", "-show_entries",
                          "stream=nb_read_frames,r_frame_rate", "-of", "json", str(path)],
                         capture_output=True, text=True, check=True)  # fmt: skip
    stream = json.loads(out.stdout)["streams"][0]
    num, den = stream["r_frame_rate"].split("/")
    return int(stream["nb_read_frames"]), int(num) / int(den)


def time_ffmpeg(path: Path, threads: int, startup: float) -> float:
    t = time.perf_counter()
    subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-threads", str(threads), "-i", str(path), "-an", "-f", "null", "-"],
                   check=True)  # fmt: skip
    return time.perf_counter() - t - startup


def time_deskpod(path: Path, threads: int) -> tuple[float, int]:
    (source,) = expand_sources([str(path)])
    t = time.perf_counter()
    n = sum(1 for _ in read(source, FPS, threads=threads))
    return time.perf_counter() - t, n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--clips", nargs="+", default=["cockatoo", "vtest", "carphone"], help="clips (tests/video/clips.py)"
    )
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-docs", action="store_true")
    args = ap.parse_args()
    starts = []
    for _ in range(5):
        t = time.perf_counter()
        subprocess.run(["ffmpeg", "-version"], capture_output=True, check=True)
        starts.append(time.perf_counter() - t)
    startup = statistics.median(starts)
    rows: list[dict[str, Any]] = []
    wrong: list[str] = []
    for name in args.clips:
        path = find(name)
        frames, rate = frame_count(path)
        for threads in args.threads:
            time_ffmpeg(path, threads, startup)
            _, sampled = time_deskpod(path, threads)
            ff = statistics.median(time_ffmpeg(path, threads, startup) for _ in range(args.repeat))
            dp = statistics.median(time_deskpod(path, threads)[0] for _ in range(args.repeat))
            rows.append({"clip": path.name, "frames": frames, "threads": threads, "sampled": sampled,
                         "ffmpeg_fps": frames / ff, "deskpod_fps": frames / dp, "ratio": ff / dp})  # fmt: skip
            duration = frames / rate
            if abs(sampled - duration * FPS) > 2:
                wrong.append(f"{path.name}: sampled {sampled} frames, expected ~{duration * FPS:.0f}")
    met = not wrong and all(r["ratio"] >= TARGET for r in rows)
    res = {"rows": rows, "ffmpeg_startup_s": startup, "target": TARGET, "met": met, "wrong": wrong, "cpu": cpu_model()}

    def report(res: dict[str, Any], command: str) -> str:
        lines = [SUB, "", f"`{command}` on {res['cpu']}: frames/s decoding every frame (deskpod also converts the "
                 f"5-fps sample to BGR); ffmpeg's process start ({startup * 1000:.0f} ms) subtracted. Target "
                 f"deskpod >= {TARGET}x ffmpeg: {'met' if met else 'NOT met'}.", "",
                 "| clip | frames | threads | ffmpeg frames/s | deskpod frames/s | deskpod / ffmpeg |", "|---|---|---|---|---|---|"]  # fmt: skip
        for r in rows:
            lines.append(f"| {r['clip']} | {r['frames']} | {r['threads']} | {r['ffmpeg_fps']:.0f} | "
                         f"{r['deskpod_fps']:.0f} | {r['ratio']:.2f}x |")  # fmt: skip
        lines += [f"- wrong: {w}" for w in wrong]
        return "\n".join(lines) + "\n"

    return publish(res, met, only=False, docs=not args.no_docs, report=report, section=SECTION, subsection=SUB,
                   intro=INTRO)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
