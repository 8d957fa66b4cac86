from __future__ import annotations

from pathlib import Path

import pytest

from deskpod.errors import ConfigError
from deskpod.train.config import TrainConfig, build_config, read_config_file


def test_defaults_are_the_demo() -> None:
    cfg = build_config()
    assert (cfg.model, cfg.data, cfg.devices, cfg.precision) == ("convnet", "fashion-mnist", "all", "auto")


def test_file_then_flags(tmp_path: Path) -> None:
    f = tmp_path / "run.toml"
    f.write_text('model = "resnet18"\nbatch_size = 64\nlr = 0.05\n')
    cfg = build_config(f, {"batch_size": 32, "epochs": None})
    assert (
        cfg.model == "resnet18" and cfg.batch_size == 32 and cfg.lr == 0.05 and cfg.epochs == TrainConfig().epochs
    )  # not given anywhere: the default


def test_train_table_is_accepted(tmp_path: Path) -> None:
    f = tmp_path / "run.toml"
    f.write_text('[train]\nmodel = "mlp"\n')
    assert build_config(f).model == "mlp"


def test_unknown_key_lists_valid_keys_and_suggests(tmp_path: Path) -> None:
    f = tmp_path / "run.toml"
    f.write_text("batchsize = 3\n")
    with pytest.raises(ConfigError) as e:
        read_config_file(f)
    msg = str(e.value)
    assert "unknown config key 'batchsize'" in msg and "did you mean 'batch_size'" in msg and "grad_accum" in msg


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        ("precision", "fp8", "precision = 'fp8'"),
        ("batch_size", 0, "batch_size = 0"),
        ("optimizer", "lamb", "sgd, adamw"),
        ("name", "../escape", "no spaces or slashes"),
        ("momentum", 1.5, "[0, 1)"),
    ],
)
def test_bad_values_name_the_value(key: str, value: object, needle: str) -> None:
    with pytest.raises(ConfigError) as e:
        build_config(None, {key: value})
    assert needle in str(e.value)


def test_wrong_types_are_refused() -> None:
    with pytest.raises(ConfigError, match="use a whole number"):
        build_config(None, {"epochs": "three"})
    with pytest.raises(ConfigError, match="true or false"):
        build_config(None, {"compile": "yes"})


def test_not_toml(tmp_path: Path) -> None:
    f = tmp_path / "bad.toml"
    f.write_text("model = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        read_config_file(f)
    with pytest.raises(ConfigError, match="no such file"):
        read_config_file(tmp_path / "missing.toml")


def test_round_trip(tmp_path: Path) -> None:
    from deskpod.train.config import dump_config, load_config

    cfg = build_config(None, {"model": "resnet50", "lr": 0.2, "compile": True})
    (tmp_path / "c.toml").write_text(dump_config(cfg))
    assert load_config(tmp_path / "c.toml") == cfg
    assert isinstance(cfg, TrainConfig)


def test_one_name_limit_for_runs_jobs_and_scripts() -> None:
    """A run is named after its pod job: the trainer, the job spec and ``deskpod run`` take the same names."""
    from deskpod.jobs.spec import parse_spec
    from deskpod.train.runs import NAME_MAX, NAME_RE, default_run_name
    from deskpod.train.script import default_name

    longest, over = "r" * NAME_MAX, "r" * (NAME_MAX + 1)
    assert build_config(None, {"name": longest}).name == longest
    assert parse_spec({"name": longest, "train": {"model": "convnet"}}).name == longest
    for refuse in (lambda: build_config(None, {"name": over}), lambda: parse_spec({"name": over, "command": ["x"]})):
        with pytest.raises(ConfigError, match=f"1-{NAME_MAX} letters"):
            refuse()
    # names made up for a run nobody named are valid ones, however long the model, data or script
    made = default_run_name("my.package.with_a_rather_long_module_name:build_the_model_" + "x" * 60,
                            "imagefolder:/data/" + "y" * 80)  # fmt: skip
    assert NAME_RE.match(made) and len(made) <= NAME_MAX, made
    assert NAME_RE.match(default_name(["/tmp/" + "s" * 100 + ".py"]))


def test_the_resolved_config_says_what_the_data_imposed(tmp_path: Path) -> None:
    """Fashion-MNIST has 10 classes of 28×28 images whatever num_classes and image_size say by default: the run's
    config.toml (what the dashboard shows as the run's config) says 10 and 28."""
    from deskpod.train.launcher import prepare

    plan = prepare(None, {"data": "fashion-mnist", "model": "convnet", "out": str(tmp_path), "name": "fm",
                          "devices": "1"}, resume=False)  # fmt: skip
    assert (plan.cfg.num_classes, plan.cfg.image_size) == (10, 28) == (plan.data.num_classes, plan.data.image_size[0])
    synthetic = prepare(None, {"data": "synthetic:1x8x6", "model": "mlp", "num_classes": 3, "out": str(tmp_path),
                               "name": "syn", "devices": "1"}, resume=False).cfg  # fmt: skip
    assert (synthetic.num_classes, synthetic.image_size) == (3, 224)  # no side to say; the classes are its own
