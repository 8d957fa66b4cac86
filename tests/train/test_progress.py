from __future__ import annotations

import io
import json

from deskpod.train.progress import Progress, describe_validation, format_duration, format_rate, pick_mode


def test_lines_mode_prints_log_steps_with_facts() -> None:
    out = io.StringIO()
    p = Progress("lines", out)
    p.update(epoch=1, epochs=3, step=5, total=10, loss=None, images_per_s=100.0, eta_s=5, log=False)
    p.update(epoch=1, epochs=3, step=6, total=10, loss=0.5, images_per_s=1234.0, eta_s=65, log=True)
    assert out.getvalue() == "epoch 1/3  step 6/10  loss 0.5000 | 1,234 img/s | ETA 1:05\n"


def test_bar_mode_redraws_in_place_and_keeps_the_last_loss() -> None:
    out = io.StringIO()
    p = Progress("bar", out, min_interval=0.0)
    p.update(epoch=1, epochs=1, step=1, total=4, loss=0.9, images_per_s=10.0, eta_s=3, log=True)
    p.update(epoch=1, epochs=1, step=2, total=4, loss=None, images_per_s=10.0, eta_s=2, log=False)
    p.event("val", text="epoch 1: accuracy 50%")
    text = out.getvalue()
    assert text.count("\r") == 2 and "[##########" in text and text.rsplit("\r", 1)[1].count("0.9000") == 1
    assert text.endswith("\nepoch 1: accuracy 50%\n")


def test_json_and_quiet_modes() -> None:
    out = io.StringIO()
    p = Progress("json", out)
    p.event("val", step=3, val_accuracy=0.5, text="for humans")
    p.update(epoch=1, epochs=1, step=3, total=3, loss=0.25, images_per_s=9.0, eta_s=0, log=True)
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    assert events[0] == {"event": "val", "step": 3, "val_accuracy": 0.5}
    assert events[1]["event"] == "step" and events[1]["loss"] == 0.25
    quiet = io.StringIO()
    Progress("quiet", quiet).event("val", text="x")
    assert quiet.getvalue() == ""
    assert pick_mode(False, True) == "json" and pick_mode(True, False) == "quiet"
    assert pick_mode(False, False, io.StringIO()) == "lines"


def test_format_duration() -> None:
    assert (format_duration(59.6), format_duration(61), format_duration(3725)) == ("1:00", "1:01", "1:02:05")


def test_validation_figures_read_as_a_line_for_any_task() -> None:
    assert (
        describe_validation({"val_loss": 0.31234, "val_accuracy": 0.9012}) == "validation loss 0.3123, accuracy 90.12%"
    )
    assert (
        describe_validation({"val_loss": 0.5, "val_sensitivity": 0.769231, "val_fp_per_crop": 1.5})
        == "validation loss 0.5000, sensitivity 0.7692, fp per crop 1.5"
    )


def test_slow_rates_keep_their_digits() -> None:
    assert format_rate(1234.4) == "1,234"
    assert format_rate(0.48) == "0.48"
    assert format_rate(3.14159) == "3.1"
    assert format_rate(0.0) == "0"
