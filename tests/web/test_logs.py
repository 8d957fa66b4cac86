"""`deskpod.web.logs`: which files a job's search reads, grep-like matches with context, caps, tails."""

from __future__ import annotations

from pathlib import Path

import pytest

from deskpod.errors import ConfigError
from deskpod.web.logs import LogFile, log_files, search, tail, utf8_cut


def job_with_logs(tmp_path: Path) -> tuple[Path, Path]:
    folder = tmp_path / "jobs" / "7"
    run = folder / "runs" / "r"
    (run / "logs").mkdir(parents=True)
    (folder / "output.log").write_text("--- deskpod: job 7 attempt 1 ---\ntraining\n")
    for name in ("rank10.attempt0.stderr", "rank2.attempt0.stderr", "rank2.attempt1.stderr", "agent.log"):
        (run / "logs" / name).write_text(f"{name}\n")
    (run / "logs" / "notes.txt").write_text("not a log\n")
    return folder, run


def test_files_are_the_output_log_then_every_rank_in_order(tmp_path: Path) -> None:
    folder, run = job_with_logs(tmp_path)
    labels = [f.label for f in log_files(folder, run)]
    assert labels == [
        "output.log",
        "logs/agent.log",
        "logs/rank2.attempt0.stderr",
        "logs/rank2.attempt1.stderr",
        "logs/rank10.attempt0.stderr",
    ]
    assert [f.label for f in log_files(folder, None)] == ["output.log"]
    assert log_files(tmp_path / "nothing", None) == []


def lines_file(tmp_path: Path, name: str, lines: list[str]) -> LogFile:
    p = tmp_path / name
    p.write_text("".join(line + "\n" for line in lines))
    return LogFile(name, p)


def test_a_match_comes_with_its_context_like_grep(tmp_path: Path) -> None:
    body = [f"line {i}" for i in range(1, 21)]
    body[9] = "Traceback (most recent call last):"  # line 10
    body[10] = '  File "train.py", line 3'
    body[11] = "RuntimeError: NCCL timeout on rank 1"  # line 12
    f = lines_file(tmp_path, "rank1.attempt0.stderr", body)
    got = search([f], "nccl TIMEOUT", context=2)
    assert got["hits"] == 1 and not got["capped"]
    (block,) = got["blocks"]
    assert block["file"] == "rank1.attempt0.stderr"
    assert [ln["line"] for ln in block["lines"]] == [10, 11, 12, 13, 14]
    hit = block["lines"][2]
    assert hit["match"] and hit["text"] == "RuntimeError: NCCL timeout on rank 1"
    assert [hit["text"][a:b] for a, b in hit["spans"]] == ["NCCL timeout"]
    assert not any(ln["match"] for ln in block["lines"] if ln is not hit)


def test_touching_matches_share_a_block_and_distant_ones_do_not(tmp_path: Path) -> None:
    body = ["x"] * 30
    for i in (5, 7, 20):
        body[i - 1] = f"warn {i}"
    f = lines_file(tmp_path, "a.log", body)
    got = search([f], "warn", context=1)
    assert got["hits"] == 3
    assert [[ln["line"] for ln in b["lines"]] for b in got["blocks"]] == [[4, 5, 6, 7, 8], [19, 20, 21]]
    got = search([f], "warn", context=0)
    assert [[ln["line"] for ln in b["lines"]] for b in got["blocks"]] == [[5], [7], [20]]


def test_results_are_capped_and_say_so(tmp_path: Path) -> None:
    f = lines_file(tmp_path, "big.log", [f"step {i} loss nan" for i in range(50)])
    got = search([f], "NaN", max_hits=10)
    assert got["hits"] == 10 and got["capped"] is True
    got = search([f], "NaN", max_hits=50)
    assert got["hits"] == 50 and got["capped"] is False


def test_regex_and_bad_regex(tmp_path: Path) -> None:
    f = lines_file(tmp_path, "r.log", ["loss 0.5", "loss 12.25", "lossy"])
    got = search([f], r"loss \d+\.\d{2}$", regex=True, context=0)
    assert [ln["text"] for b in got["blocks"] for ln in b["lines"]] == ["loss 12.25"]
    plain = search([f], r"loss \d", context=0)  # not a regex: the text as typed
    assert plain["hits"] == 0
    with pytest.raises(ConfigError, match="not a valid regular expression"):
        search([f], "loss (", regex=True)
    with pytest.raises(ConfigError, match="type some text"):
        search([f], "")
    with pytest.raises(ConfigError, match="context 11"):
        search([f], "loss", context=11)


def test_markup_and_bad_bytes_stay_text(tmp_path: Path) -> None:
    p = tmp_path / "x.log"
    p.write_bytes(b"<b>bold</b> \xff\xfe <script>alert(1)</script>\n")
    got = search([LogFile("x.log", p)], "<script>")
    line = got["blocks"][0]["lines"][0]
    assert line["text"].startswith("<b>bold</b> \ufffd\ufffd <script>")
    assert [line["text"][a:b] for a, b in line["spans"]] == ["<script>"]


def test_tail_gives_the_last_lines_and_where_to_go_on(tmp_path: Path) -> None:
    p = tmp_path / "output.log"
    p.write_text("".join(f"line {i}\n" for i in range(5000)))
    text, offset, cut = tail(p, max_bytes=1 << 20, max_lines=100)
    assert cut and offset == p.stat().st_size
    assert text.splitlines()[0] == "line 4900" and text.splitlines()[-1] == "line 4999"
    text, offset, cut = tail(p, max_bytes=100, max_lines=1000)
    assert cut and not text.startswith("ine") and text.endswith("line 4999\n")
    small = tmp_path / "small.log"
    small.write_text("a\nb\n")
    assert tail(small) == ("a\nb\n", 4, False)
    assert tail(tmp_path / "missing.log") == ("", 0, False)


def test_a_split_character_waits() -> None:
    snow = "☃".encode()  # 3 bytes
    assert utf8_cut(b"ab" + snow) == 5
    assert utf8_cut(b"ab" + snow[:2]) == 2
    assert utf8_cut(b"ab" + snow[:1]) == 2
    assert utf8_cut(b"") == 0
    p_text = b"ok\n" + snow[:1]
    assert p_text[: utf8_cut(p_text)] == b"ok\n"
