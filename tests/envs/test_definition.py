"""The ``[environment]`` table, this box's Pythons, and container images: what is accepted, and what each bad input says."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from deskpod.envs.cache import find_uv
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


LOCAL_REFERENCES = [
    "evil @ /home/alice/evil",
    "evil @ ./rel",
    "evil @ ../x/evil-1.0.tar.gz",
    "evil @ rel/evil",
    "evil @ ~/evil",
    "evil @ file:///home/alice/evil-1.0-py3-none-any.whl",
    "evil @ FILE:/home/alice/evil",
    "evil @ git+file:///home/alice/evil.git",
    "evil @ GIT+FILE:///home/alice/evil.git@v1",
    "evil @ hg+file:///home/alice/evil",
    "evil @ svn+file:///home/alice/evil",
    "evil @ bzr+file:///home/alice/evil",
    "evil @ C:/evil",
    'evil @ /home/alice/evil ; python_version >= "3"',
]
NETWORK_REFERENCES = [
    "six @ https://files.example/six-1.17.0-py2.py3-none-any.whl",
    "six @ http://127.0.0.1:8000/six-1.17.0-py2.py3-none-any.whl",
    "demo @ git+https://github.com/example/demo@v1.0",
    "demo @ git+ssh://git@github.com/example/demo",
    "demo @ hg+https://hg.example/demo",
]
REFERENCE_FORMS: dict[str, Callable[[str], dict[str, object]]] = {
    "packages": lambda r: {"packages": ["six==1.17.0", r]},
    "requirements": lambda r: {"requirements": {"file": "requirements.txt", "text": f"six==1.17.0\n{r}\n"}},
    "pyproject": lambda r: {"pyproject": {"file": "pyproject.toml",
                                          "text": f'[project]\nname = "x"\ndependencies = [{json.dumps(r)}]\n'}},
}  # fmt: skip


@pytest.mark.parametrize("form", sorted(REFERENCE_FORMS))
@pytest.mark.parametrize("reference", LOCAL_REFERENCES)
def test_a_local_path_is_refused_in_every_form(form: str, reference: str) -> None:
    message = refused(REFERENCE_FORMS[form](reference))
    where = {"packages": "packages", "requirements": "requirements 'requirements.txt' line 2",
             "pyproject": "pyproject 'pyproject.toml' dependencies"}[form]  # fmt: skip
    assert message.startswith(f"job spec: environment.{where}: '{reference.split(' ;')[0]}")
    assert (
        "points at a local file or folder, whose contents would not be part of what defines the environment;" in message
    )
    assert message.endswith("; put the package on a package index or find-links folder and require it by version,"
                            " or give its https:// or git+https:// URL")  # fmt: skip


@pytest.mark.parametrize("form", sorted(REFERENCE_FORMS))
@pytest.mark.parametrize("reference", NETWORK_REFERENCES)
def test_a_network_url_is_taken(form: str, reference: str) -> None:
    d = parse_environment(REFERENCE_FORMS[form](reference))
    assert reference in d.requirements_text().splitlines()


@pytest.mark.parametrize("reference", ["x @ ftp://files.example/x.whl", "x @ https:/files.example/x.whl",
                                       "x @ git+ftp://git.example/x", "x @ data:text/plain,x"])  # fmt: skip
def test_a_url_builds_do_not_fetch_is_refused(reference: str) -> None:
    message = refused({"packages": [reference]})
    assert message.startswith(f"job spec: environment.packages: {reference!r} is not a network URL an environment"
                              " build fetches (https://, git+https://, ...); put the package on")  # fmt: skip


def lock_with(source: str, name: str = "evil", project: str = "demo", files: str = "") -> dict[str, object]:
    lock = (
        f'version = 1\nrequires-python = ">=3.10"\n\n[[package]]\nname = "{project}"\nversion = "0.1"\n'
        f'source = {{ virtual = "." }}\n\n[[package]]\nname = "{name}"\nversion = "1.0"\nsource = {source}\n'
        f"{files}"
    )
    return {"lock": {"file": "uv.lock", "text": lock}, "pyproject": {"file": "pyproject.toml", "text": PYPROJECT}}


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ('{ path = "../evil-1.0-py3-none-any.whl" }', "comes from a local path ('../evil-1.0-py3-none-any.whl')"),
        ('{ directory = "/home/alice/evil" }', "comes from a local directory ('/home/alice/evil')"),
        ('{ editable = "../evil" }', "comes from a local editable ('../evil')"),
        ('{ virtual = "packages/evil" }', "comes from a local virtual ('packages/evil')"),
        ('{ editable = "." }', "comes from a local editable ('.')"),  # "." is the project's own name only
        ('{ git = "file:///home/alice/evil#0123abcd" }',
         "comes from git 'file:///home/alice/evil#0123abcd', which points at a local file or folder"),
        ('{ git = "/home/alice/evil" }', "comes from git '/home/alice/evil', which points at a local file or folder"),
        ('{ url = "file:///home/alice/evil-1.0.tar.gz" }', "comes from url 'file:///home/alice/evil-1.0.tar.gz'"),
        ('{ url = "ftp://x/evil.tar.gz" }', "which is not a network URL an environment build fetches (http://, https://)"),
        ('{ git = "git+https://github.com/x/evil" }', "which is not a network URL an environment build fetches"),
        ('{ workspace = "../evil" }', "has source workspace = '../evil'; expected one of registry, git, url, path"),
        ('"../evil"', "has source = '../evil'; expected one of registry, git, url, path, directory, editable, virtual"),
    ],
)  # fmt: skip
def test_a_lock_with_a_local_source_is_refused(source: str, expected: str) -> None:
    message = refused(lock_with(source))
    assert message.startswith("job spec: environment.lock 'uv.lock': package 'evil' ")
    assert expected in message


PYPI = '{ registry = "https://pypi.org/simple" }'
WHEEL = "evil-1.0-py3-none-any.whl"


@pytest.mark.parametrize(
    ("source", "files", "expected"),
    [
        (PYPI, f'wheels = [{{ url = "file:///home/alice/{WHEEL}", hash = "sha256:00" }}]\n',
         f"has a file at 'file:///home/alice/{WHEEL}', which points at a local file or folder"),
        (PYPI, 'sdist = { path = "/home/alice/evil-1.0.tar.gz", hash = "sha256:00" }\n',
         "has a file at '/home/alice/evil-1.0.tar.gz', which points at a local file or folder"),
        ('{ git = "https://github.com/x/evil#00" }', f'wheels = [{{ path = "../{WHEEL}" }}]\n',
         f"has a file at '../{WHEEL}', which points at a local file or folder"),
        (PYPI, 'sdist = { url = "ftp://x/evil-1.0.tar.gz" }\n',
         "has a file at 'ftp://x/evil-1.0.tar.gz', which is not a network URL an environment build fetches"),
        (PYPI, f'wheels = [{{ url = "https://files.example/{WHEEL}" }}]\n', None),
        ('{ registry = "/opt/pypi/simple" }', f'wheels = [{{ path = "/opt/pypi/files/{WHEEL}", hash = "sha256:00" }}]\n',
         None),  # a local index's files are paths (the test_cache lock is one, made by uv)
    ],
)  # fmt: skip
def test_a_locked_file_at_a_local_path_is_refused(source: str, files: str, expected: str | None) -> None:
    table = lock_with(source, files=files)
    if expected is None:
        assert parse_environment(table).kind == "lock"
    else:
        message = refused(table)
        assert message.startswith(f"job spec: environment.lock 'uv.lock': package 'evil' {expected}")


@pytest.mark.parametrize(
    "source",
    [
        '{ registry = "https://pypi.org/simple" }',
        '{ registry = "/opt/pypi/simple" }',  # the box's own index may be a folder: its files are pinned by hash
        '{ git = "https://github.com/x/demo?rev=v1#0123abcd" }',
        '{ git = "ssh://git@github.com/x/demo#0123abcd" }',
        '{ url = "http://127.0.0.1:8000/demo-1.0.tar.gz" }',
    ],
)
def test_a_lock_from_indexes_and_network_urls_is_taken(source: str) -> None:
    assert parse_environment(lock_with(source)).kind == "lock"


def test_what_uv_writes_for_local_sources_is_refused_and_the_project_itself_taken(tmp_path: Path) -> None:
    """Locks made by this box's uv (offline; local sources need no index): the root project, whether a package
    (``{ editable = "." }``) or not (``{ virtual = "." }``), is taken; each kind of local dependency is refused."""
    uv = find_uv()
    assert uv is not None, "uv is installed with deskpod"
    for name in ("localdir", "localedit", "localgit"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "pyproject.toml").write_text(
            f'[project]\nname = "{name}"\nversion = "0.1"\n[build-system]\nrequires = ["setuptools"]\n'
            'build-backend = "setuptools.build_meta"\n'
        )
    wheel = tmp_path / "localwheel-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("localwheel-0.1.dist-info/METADATA", "Metadata-Version: 2.1\nName: localwheel\nVersion: 0.1\n")
        z.writestr("localwheel-0.1.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr("localwheel-0.1.dist-info/RECORD", "")
    git = ["git", "-C", str(tmp_path / "localgit"), "-c", "user.name=t", "-c", "user.email=t@t"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "x"]):
        subprocess.run([*git, *args], check=True, capture_output=True)
    dependencies = {
        "": ("", ""),
        "localdir": ("localdir", 'localdir = { path = "../localdir" }'),
        "localedit": ("localedit", 'localedit = { path = "../localedit", editable = true }'),
        "localwheel": ("localwheel", f'localwheel = {{ path = "../{wheel.name}" }}'),
        "localgit": ("localgit", f'localgit = {{ git = "{(tmp_path / "localgit").as_uri()}" }}'),
    }
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "UV_CACHE_DIR": str(tmp_path / "uv-cache"),
           "UV_OFFLINE": "1", "UV_NO_CONFIG": "1"}  # fmt: skip
    seen: dict[tuple[str, bool], str] = {}
    for dep, (name, source) in dependencies.items():
        for package in (False, True):
            project = tmp_path / f"p-{dep or 'none'}-{package}"
            project.mkdir()
            pyproject = (f'[project]\nname = "Demo_Project"\nversion = "0.1"\nrequires-python = ">=3.10"\n'
                         f"dependencies = {json.dumps([name] if name else [])}\n"
                         + ('[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
                            if package else "")
                         + (f"[tool.uv.sources]\n{source}\n" if source else ""))  # fmt: skip
            (project / "pyproject.toml").write_text(pyproject)
            done = subprocess.run([uv, "lock", "--python", sys.executable], cwd=project, env=env, capture_output=True,
                                  text=True)  # fmt: skip
            assert done.returncode == 0, done.stderr
            lock = (project / "uv.lock").read_text()
            assert f'source = {{ {"editable" if package else "virtual"} = "." }}' in lock  # what uv writes for it
            table = {"lock": {"file": "uv.lock", "text": lock}, "pyproject": {"file": "pyproject.toml",
                                                                              "text": pyproject}}  # fmt: skip
            if not dep:
                assert parse_environment(table).kind == "lock"
                continue
            seen[(dep, package)] = refused(table)
    for (dep, _), message in seen.items():
        kind = {"localdir": "a local directory", "localedit": "a local editable", "localwheel": "a local path",
                "localgit": "git"}[dep]  # fmt: skip
        assert message.startswith(f"job spec: environment.lock 'uv.lock': package '{dep}' comes from {kind}"), message


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
        ({"packages": ["evil @ /home/alice/evil"]}, "points at a local file or folder"),
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
