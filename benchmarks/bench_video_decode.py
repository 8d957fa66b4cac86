"""Decode: deskpod's ingest against ``ffmpeg -threads N -i clip -f null -``, same clip, same threads, one run.

    .venv/bin/python benchmarks/bench_video_decode.py               # table + JSON, updates docs/benchmarks.md
    .venv/bin/python benchmarks/bench_video_decode.py --no-docs --repeat 1     # a quick look

Each clip is first made ``--loops`` times longer by stream copy (``ffmpeg -stream_loop N-1 -i clip -c copy``,
untimed; no re-encoding, so the frames are the clip's own), so that the run is long beside process start.
deskpod's side is what ``deskpod video index`` runs for a file, `deskpod.video.sources.read` at the default
``--fps 5``: PyAV (FFmpeg's libraries in the av wheel) decodes every frame with frame threads and converts the
sampled ones to BGR. Its frames/s is the clip's frames (all decoded) over the wall time. The reference is Debian's
ffmpeg CLI decoding the same clip to the null muxer with ``-threads N`` (its own FFmpeg build, 5.1 here; the
wheel's is newer); its frames/s is the same frame count over its wall time less its fixed cost (process start,
probing the file), measured as the same command stopped after one frame (``-frames:v 1``) and subtracted. Each is the median of ``--repeat`` runs after one untimed warm
run, the two sides interleaved run by run. Checked outside the timing: deskpod decoded as many frames as ffprobe counts, and sampled the number that
5 fps predicts. Target: deskpod >= 0.9x ffmpeg's frames/s at every thread count.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
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


def time_ffmpeg(path: Path, threads: int, frames: int | None = None) -> float:
    limit = ["-frames:v", str(frames)] if frames else []
    t = time.perf_counter()
    subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-threads", str(threads), "-i", str(path), "-an", *limit,
                    "-f", "null", "-"], check=True)  # fmt: skip
    return time.perf_counter() - t


def lengthen(path: Path, loops: int, folder: Path) -> Path:
    out = folder / f"{path.stem}-x{loops}{path.suffix}"
    subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-y", "-stream_loop", str(loops - 1), "-i", str(path), "-an",
                    "-c", "copy", str(out)], check=True)  # fmt: skip
    return out


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
    ap.add_argument("--loops", type=int, default=10, help="copies of each clip played back to back (default 10)")
    ap.add_argument("--no-docs", action="store_true")
    args = ap.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench-video-decode-"))
    rows: list[dict[str, Any]] = []
    wrong: list[str] = []
    for name in args.clips:
        path = lengthen(find(name), args.loops, folder)
        frames, rate = frame_count(path)
        for threads in args.threads:
            time_ffmpeg(path, threads)
            _, sampled = time_deskpod(path, threads)
            ffs, dps = [], []
            for _ in range(args.repeat):  # interleaved, so that a change in the box's load falls on both sides
                ffs.append(time_ffmpeg(path, threads) - time_ffmpeg(path, threads, 1))
                dps.append(time_deskpod(path, threads)[0])
            ff, dp = statistics.median(ffs), statistics.median(dps)
            rows.append({"clip": path.name, "frames": frames, "threads": threads, "sampled": sampled,
                         "ffmpeg_fps": frames / ff, "deskpod_fps": frames / dp, "ratio": ff / dp})  # fmt: skip
            duration = frames / rate
            if abs(sampled - duration * FPS) > 2:
                wrong.append(f"{path.name}: sampled {sampled} frames, expected ~{duration * FPS:.0f}")
    met = not wrong and all(r["ratio"] >= TARGET for r in rows)
    shutil.rmtree(folder)
    res = {"rows": rows, "loops": args.loops, "target": TARGET, "met": met, "wrong": wrong, "cpu": cpu_model()}

    def report(res: dict[str, Any], command: str) -> str:
        lines = [SUB, "", f"`{command}` on {res['cpu']}: frames/s decoding every frame (deskpod also converts the "
                 f"5-fps sample to BGR), each clip played {args.loops} times; ffmpeg's fixed cost (its one-frame run) subtracted. Target "
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
