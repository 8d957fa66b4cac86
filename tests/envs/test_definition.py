"""The ``[environment]`` table, this box's Pythons, and container images: what is accepted, and what each bad input says."""

from __future__ import annotations

import json
import os
import re
import sys
import sysconfig
from pathlib import Path

import pytest

from deskpod.envs.definition import ENVIRONMENT_SCHEMA, FIELDS, EnvFile, parse_environment
from deskpod.envs.images import check_image, container_runtime, enroot_setup_argv, enroot_uri, image_argv
from deskpod.envs.python import available_pythons, candidate_paths, probe, resolve_python
from deskpod.errors import ConfigError

LOCK = """version = 1
requires-python = ">=3.10"

[[package]]
name = "demo"
version = "0.1"
source = { virtual = "." }

[[package]]
name = "six"
version = "1.17.0"
source = { registry = "https://pypi.org/simple" }
"""
PYPROJECT = '[project]\nname = "demo"\nversion = "0.1"\ndependencies = ["six==1.17.0", "idna >= 3"]\n'
SIX_HASH = "sha256:4721f391ed90541fddacab5acf947aa0d3dc7d27b2e1e8eda2be8970586c3274"


def refused(table: object, base_dir: Path | None = None) -> str:
    with pytest.raises(ConfigError) as e:
        parse_environment(table, base_dir=base_dir)
    message = str(e.value)
    assert "\n" not in message
    return message


def test_packages_are_normalised_and_round_trip() -> None:
    d = parse_environment({"packages": ["six == 1.17.0", "idna>=3; python_version >= '3.8'"], "python": "3.11"})
    assert d.kind == "packages" and d.python == "3.11"
    assert d.packages == ("six==1.17.0", 'idna>=3; python_version >= "3.8"')
    assert d.to_json() == {"python": "3.11", "packages": list(d.packages)}
    assert parse_environment(d.to_json()) == d
    assert d.requirements_text() == "six==1.17.0\n" + 'idna>=3; python_version >= "3.8"\n'
    assert d.summary() == 'packages six==1.17.0, idna>=3; python_version >= "3.8"'


def test_files_are_read_beside_the_spec_and_travel_as_text(tmp_path: Path) -> None:
    (tmp_path / "requirements.txt").write_text(
        f"# pinned\n\nsix==1.17.0 \\\n    --hash={SIX_HASH}\nidna>=3  # any recent\n"
    )
    d = parse_environment({"requirements": "requirements.txt"}, base_dir=tmp_path)
    assert d.kind == "requirements"
    assert d.requirements == EnvFile("requirements.txt", (tmp_path / "requirements.txt").read_text())
    assert d.summary() == "requirements requirements.txt (2 requirements)"
    # The stored form needs no file: the HTTP API, and the daemon reading a stored job, take it back unchanged.
    stored = json.loads(json.dumps(d.to_json()))
    assert stored == {"requirements": {"file": "requirements.txt", "text": d.requirements.text}}
    assert parse_environment(stored) == d == parse_environment(stored, base_dir=tmp_path)


def test_a_lock_takes_the_pyproject_beside_it(tmp_path: Path) -> None:
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "uv.lock").write_text(LOCK)
    (tmp_path / "proj" / "pyproject.toml").write_text(PYPROJECT)
    d = parse_environment({"lock": "proj/uv.lock", "python": "3.12"}, base_dir=tmp_path)
    assert d.kind == "lock" and d.lock is not None and d.pyproject is not None
    assert d.pyproject.file == "proj/pyproject.toml" and d.pyproject.text == PYPROJECT
    assert d.summary() == "lock proj/uv.lock (2 packages)"
    assert parse_environment(d.to_json()) == d
    explicit = parse_environment({"lock": "proj/uv.lock", "pyproject": "proj/pyproject.toml"}, base_dir=tmp_path)
    assert explicit.lock == d.lock and explicit.pyproject == d.pyproject


def test_a_pyproject_alone_installs_its_dependencies(tmp_path: Path) -> None:
    d = parse_environment({"pyproject": {"file": "pyproject.toml", "text": PYPROJECT}})
    assert d.kind == "pyproject"
    assert d.requirements_text() == "six==1.17.0\nidna>=3\n"
    assert d.summary() == "pyproject pyproject.toml (2 dependencies)"


def test_an_image_is_a_reference() -> None:
    d = parse_environment({"image": "docker.io/library/python:3.11"})
    assert d.kind == "image" and d.to_json() == {"image": "docker.io/library/python:3.11"}
    assert parse_environment(d.to_json()) == d


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        ([], "job spec: environment must be a table/object with one of packages, requirements, lock, pyproject, image"),
        ({"packges": ["six"]}, "job spec: environment.packges is not a field; valid fields: " + ", ".join(FIELDS)),
        ({}, "give exactly one of packages (a list of requirements), requirements (a requirements.txt)"),
        ({"python": "3.11"}, "got none"),
        ({"packages": ["six"], "image": "python:3.11"}, "got packages and image"),
        ({"packages": "six"}, "job spec: environment.packages = 'six' is not valid; expected a list of 1 to 1000"),
        ({"packages": []}, "environment.packages = [] is not valid"),
        ({"packages": ["six==="]}, "job spec: environment.packages: 'six===' is not a valid requirement"),
        ({"packages": ["x @ file:///tmp/x.whl"]}, "points at a local file"),
        ({"packages": ["six"], "python": 3.11}, 'environment.python = 3.11 is not valid; quote the version: python = "3.11"'),
        ({"packages": ["six"], "python": "3"}, "environment.python = '3' is not valid; expected a Python 3 version"),
        ({"packages": ["six"], "python": "2.7"}, "environment.python = '2.7' is not valid"),
        ({"image": "docker.io/x:1", "python": "3.11"}, "an image brings its own Python"),
        ({"image": "bad image; rm -rf /"}, "environment.image = 'bad image; rm -rf /' is not valid; expected a container"),
        ({"requirements": "requirements.txt"}, "the pod service reads no path a request names; send the file itself,"
         ' requirements = {"file": "requirements.txt", "text": CONTENTS} (deskpod submit does this for you)'),
        ({"requirements": {"file": "r.txt"}}, 'expected {"file": NAME, "text": CONTENTS}'),
        ({"requirements": {"file": "r.txt", "text": "-r other.txt\n"}},
         "job spec: environment.requirements 'r.txt' line 1: '-r other.txt' is an option line; only requirement"),
        ({"requirements": {"file": "r.txt", "text": "six\n--index-url http://x/simple\n"}}, "'r.txt' line 2: '--index-url"),
        ({"requirements": {"file": "r.txt", "text": "six --no-deps\n"}}, "'--no-deps' is not allowed after a requirement"),
        ({"requirements": {"file": "r.txt", "text": "six\nnot a requirement!\n"}},
         "environment.requirements 'r.txt' line 2: 'not a requirement!' is not a valid requirement"),
        ({"requirements": {"file": "r.txt", "text": "six\n" * 300_000}}, "environment.requirements 'r.txt' is over 1 MB"),
        ({"lock": {"file": "uv.lock", "text": "version = [\n"}}, "job spec: environment.lock 'uv.lock' does not parse: "),
        ({"lock": {"file": "uv.lock", "text": "name = 'x'\n"}}, "environment.lock 'uv.lock' does not parse: not a uv.lock"),
        ({"lock": {"file": "uv.lock", "text": LOCK}},
         "environment.lock 'uv.lock' needs environment.pyproject too: a uv.lock is meaningless without its pyproject"),
        ({"pyproject": {"file": "pyproject.toml", "text": "[tool.x]\n"}}, "'pyproject.toml' has no [project] table"),
        ({"pyproject": {"file": "pyproject.toml", "text": "[project\n"}}, "environment.pyproject 'pyproject.toml' does not parse"),
        ({"pyproject": {"file": "p.toml", "text": '[project]\nname = "x"\ndynamic = ["dependencies"]\n'}},
         "declares its dependencies dynamic"),
        ({"pyproject": {"file": "p.toml", "text": '[project]\nname = "x"\ndependencies = ["ok", "no good"]\n'}},
         "'no good' is not a valid requirement"),
    ],
)  # fmt: skip
def test_bad_input_is_named(table: object, expected: str) -> None:
    message = refused(table)
    assert expected in message
    assert message.startswith("job spec: environment")


def test_files_that_cannot_be_read(tmp_path: Path) -> None:
    assert "environment.requirements 'missing.txt': cannot read" in refused({"requirements": "missing.txt"}, tmp_path)
    (tmp_path / "big.txt").write_bytes(b"six\n" * 300_000)
    assert "environment.requirements 'big.txt' is over 1 MB (1200000 bytes)" in refused(
        {"requirements": "big.txt"}, tmp_path
    )
    (tmp_path / "latin.txt").write_bytes(b"caf\xe9\n")
    assert "'latin.txt' is not UTF-8 text" in refused({"requirements": "latin.txt"}, tmp_path)
    (tmp_path / "uv.lock").write_text(LOCK)
    message = refused({"lock": "uv.lock"}, tmp_path)
    assert "environment.pyproject 'pyproject.toml': cannot read" in message
    assert "a uv.lock needs its pyproject.toml" in message


def test_schema_lists_what_the_parser_takes() -> None:
    assert set(ENVIRONMENT_SCHEMA["properties"]) == set(FIELDS)
    assert ENVIRONMENT_SCHEMA["additionalProperties"] is False
    assert parse_environment(ENVIRONMENT_SCHEMA["example"]).packages == ("six==1.17.0",)


# -- this box's Pythons -------------------------------------------------------------------------------------


def test_python_3_11_is_the_newest_3_11_here() -> None:
    found = available_pythons()
    assert found == sorted(found, key=lambda i: tuple(int(x) for x in re.findall(r"\d+", i.version)[:3]))
    elevens = [i for i in found if i.minor == "3.11"]
    assert elevens, "make test needs Python 3.11"
    chosen = resolve_python("3.11")
    assert chosen.minor == "3.11" and chosen.implementation == "cpython"
    assert chosen.version == max((i.version for i in elevens), key=lambda v: [int(x) for x in v.split(".")])
    assert resolve_python(chosen.version) == chosen
    assert resolve_python(None).minor == f"{sys.version_info.major}.{sys.version_info.minor}"
    assert chosen.platform == sysconfig.get_platform()


def test_a_missing_python_lists_what_there_is() -> None:
    with pytest.raises(ConfigError) as e:
        resolve_python("3.99")
    minors = ", ".join(dict.fromkeys(i.minor for i in available_pythons()))
    assert str(e.value) == f"job spec: environment.python '3.99' is not available on this box; available: {minors}"
    assert "3.11" in minors
    with pytest.raises(ConfigError, match=r"'3\.11\.99' is not available on this box; available: .*3\.11\.\d+"):
        resolve_python("3.11.99")


def test_shims_are_skipped_and_failing_pythons_left_out(tmp_path: Path) -> None:
    shims, broken = tmp_path / "shims", tmp_path / "bin"
    for folder in (shims, broken):
        folder.mkdir()
        script = folder / "python3.11"
        script.write_text("#!/bin/sh\necho 'pyenv: python3.11: command not found' >&2\nexit 127\n")
        script.chmod(0o755)
    env = {"PATH": f"{shims}{os.pathsep}{broken}", "HOME": str(tmp_path), "PYENV_ROOT": str(tmp_path / "none")}
    paths = candidate_paths(env)
    assert shims / "python3.11" not in paths and broken / "python3.11" in paths
    assert [i.path for i in probe([broken / "python3.11", Path(sys.executable)])] == [Path(sys.executable)]


# -- container images -----------------------------------------------------------------------------------------
# Neither podman nor enroot is installed on the machines deskpod is tested on: the refusal and the argv only.


def test_an_image_without_a_runtime_is_refused(tmp_path: Path) -> None:
    d = parse_environment({"image": "docker.io/library/python:3.11"})
    with pytest.raises(ConfigError) as e:
        check_image(d, path=str(tmp_path))
    assert str(e.value) == (
        "job spec: environment.image 'docker.io/library/python:3.11' needs a container runtime; this box has neither"
        " podman nor enroot (install one, or use packages/requirements/lock)"
    )
    fake = tmp_path / "enroot"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    assert container_runtime(str(tmp_path)) == "enroot" == check_image(d, path=str(tmp_path))


def test_image_argv() -> None:
    kw = {"writable": [Path("/jobs/7"), Path("/home/a/w")], "workdir": Path("/home/a/w"),
          "devices": ["/dev/nvidia0", "/dev/nvidiactl"], "env": {"SEED": "1", "CUDA_VISIBLE_DEVICES": "0"}}  # fmt: skip
    assert image_argv("podman", "docker.io/library/python:3.11", ["python", "x.py"], **kw) == [  # type: ignore[arg-type]
        "podman", "run", "--rm", "--userns=keep-id", "--network=host", "--shm-size=8g", "--workdir", "/home/a/w",
        "--volume", "/jobs/7:/jobs/7", "--volume", "/home/a/w:/home/a/w",
        "--device", "/dev/nvidia0", "--device", "/dev/nvidiactl",
        "--env", "CUDA_VISIBLE_DEVICES", "--env", "SEED",
        "docker.io/library/python:3.11", "python", "x.py",
    ]  # fmt: skip
    enroot = image_argv("/usr/bin/enroot", "docker.io/library/python:3.11", ["python", "x.py"], **kw)  # type: ignore[arg-type]
    name = enroot[enroot.index("/bin/sh") - 1]
    assert re.fullmatch(r"deskpod-python-3-11-[0-9a-f]{12}", name)
    assert enroot == [
        "/usr/bin/enroot", "start", "--rw", "--mount", "/jobs/7:/jobs/7", "--mount", "/home/a/w:/home/a/w",
        "--mount", "/dev/nvidia0:/dev/nvidia0", "--mount", "/dev/nvidiactl:/dev/nvidiactl",
        "--env", "CUDA_VISIBLE_DEVICES", "--env", "SEED",
        name, "/bin/sh", "-c", 'cd "$0" && exec "$@"', "/home/a/w", "python", "x.py",
    ]  # fmt: skip
    assert enroot_uri("docker.io/library/python:3.11") == "docker://docker.io#library/python:3.11"
    assert enroot_uri("nvcr.io/nvidia/pytorch:24.01-py3") == "docker://nvcr.io#nvidia/pytorch:24.01-py3"
    assert enroot_uri("python:3.11") == "docker://python:3.11"
    setup = enroot_setup_argv("python:3.11", Path("/store"))
    made = setup[1][3]
    assert made.startswith("deskpod-python-3-11-") and made != name  # named by the whole reference
    assert setup == [
        ["enroot", "import", "--output", f"/store/{made}.sqsh", "docker://python:3.11"],
        ["enroot", "create", "--name", made, f"/store/{made}.sqsh"],
    ]
