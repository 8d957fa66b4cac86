"""OS accounts: looked up like ``id`` sees them, become for good in a child, and folders/files made safely for them."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from deskpod.envs.accounts import (
    Account,
    account_by_name,
    account_by_uid,
    as_account,
    as_account_argv,
    current_account,
    drop_privileges,
    popen_credentials,
)
from deskpod.envs.userfiles import prepare_owned_dir, write_no_follow
from deskpod.errors import ConfigError, RunError
from tests.unix_users import make_group


def _id(*args: str) -> list[int]:
    return [int(x) for x in subprocess.run(["id", *args], capture_output=True, text=True, check=True).stdout.split()]


def in_child(account: Account, then: str = "") -> dict[str, object]:
    """Fork; the child drops to ``account`` (then, optionally, tries to become ``then``) and reports what it is."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        os.close(r)
        report: dict[str, object] = {}
        try:
            drop_privileges(account)
            report = {"res_uid": os.getresuid(), "res_gid": os.getresgid(), "groups": sorted(os.getgroups())}
            try:
                os.setuid(0)
                report["setuid0"] = "ok"
            except PermissionError:
                report["setuid0"] = "refused"
            if then:
                try:
                    drop_privileges(account_by_name(then))
                    report["then"] = "ok"
                except RunError as e:
                    report["then"] = str(e)
        except BaseException as e:
            report["error"] = repr(e)
        os.write(w, json.dumps(report).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        out = f.read()
    os.waitpid(pid, 0)
    result: dict[str, object] = json.loads(out)
    return result


def test_lookup_by_name_and_uid_matches_id(two_users: tuple[Account, Account]) -> None:
    alice, _ = two_users
    found = account_by_name(alice.name)
    assert found == alice
    assert account_by_uid(alice.uid) == alice
    assert [found.uid] == _id("-u", alice.name)
    assert [found.gid] == _id("-g", alice.name)
    assert sorted(found.groups) == sorted(_id("-G", alice.name))
    assert found.shell == "/bin/sh"


def test_current_account_is_root_here() -> None:
    me = current_account()
    assert me.uid == os.getuid()
    assert me.name == account_by_uid(os.getuid()).name


def test_unknown_account_names_it_and_says_what_to_do() -> None:
    with pytest.raises(ConfigError) as e:
        account_by_name("dpt-no-such-bob")
    assert str(e.value) == (
        "OS account 'dpt-no-such-bob' does not exist on this box; create it (useradd dpt-no-such-bob) "
        "or map the deskpod user to an existing account"
    )
    with pytest.raises(ConfigError, match=r"uid 2147483000 does not exist on this box"):
        account_by_uid(2147483000)


def test_supplementary_groups_are_read_and_taken(two_users: tuple[Account, Account]) -> None:
    alice, bob = two_users
    with make_group(alice) as gid:
        member = account_by_name(alice.name)
        assert gid in member.groups and member.gid in member.groups
        assert gid not in account_by_name(bob.name).groups
        assert gid in in_child(member)["groups"]  # type: ignore[operator]
        done = subprocess.run(as_account_argv(member, ["id", "-G"]), capture_output=True, text=True, check=True)
        assert sorted(int(g) for g in done.stdout.split()) == sorted(member.groups)


def test_drop_privileges_in_a_fork_is_for_good(two_users: tuple[Account, Account]) -> None:
    alice, bob = two_users
    report = in_child(alice, then=bob.name)
    assert "error" not in report, report
    assert report["res_uid"] == [alice.uid] * 3
    assert report["res_gid"] == [alice.gid] * 3
    assert report["groups"] == sorted(alice.groups)
    assert report["setuid0"] == "refused"
    assert "cannot become OS account" in str(report["then"]) and bob.name in str(report["then"])
    assert os.getuid() == 0  # the parent is untouched


def test_popen_credentials_start_the_child_as_the_account(two_users: tuple[Account, Account]) -> None:
    _, bob = two_users
    done = subprocess.run(["id", "-u"], capture_output=True, text=True, check=True, **popen_credentials(bob))
    assert int(done.stdout) == bob.uid
    done = subprocess.run(["id", "-G"], capture_output=True, text=True, check=True, **popen_credentials(bob))
    assert sorted(int(g) for g in done.stdout.split()) == sorted(bob.groups)


def test_as_account_argv_switches_for_good(two_users: tuple[Account, Account]) -> None:
    _, bob = two_users
    check = "import os; print(os.getresuid(), os.getresgid())\ntry:\n os.setuid(0); print('root')\nexcept OSError: print('refused')"
    argv = as_account_argv(bob, ["/usr/bin/python3", "-I", "-c", check])
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == [f"{(bob.uid,) * 3} {(bob.gid,) * 3}", "refused"]


def test_prepare_owned_dir_creates_parents_and_hands_over(tmp_path: Path, two_users: tuple[Account, Account]) -> None:
    alice, _ = two_users
    job = tmp_path / "home" / "jobs" / "7"
    assert prepare_owned_dir(job, alice) == job
    st = job.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (alice.uid, alice.gid, 0o700)
    for parent in (tmp_path / "home", tmp_path / "home" / "jobs"):
        pst = parent.stat()
        assert (pst.st_uid, stat.S_IMODE(pst.st_mode)) == (os.getuid(), 0o711)
    prepare_owned_dir(job, alice, mode=0o750)  # an existing folder is taken over again
    assert stat.S_IMODE(job.stat().st_mode) == 0o750


def test_prepare_owned_dir_refuses_a_symlink(tmp_path: Path, two_users: tuple[Account, Account]) -> None:
    alice, _ = two_users
    target = tmp_path / "etc"
    target.mkdir(mode=0o755)
    before = target.stat()
    (tmp_path / "job").symlink_to(target)
    with pytest.raises(RunError, match=r"job: it is a symbolic link"):
        prepare_owned_dir(tmp_path / "job", alice)
    after = target.stat()
    assert (after.st_uid, after.st_mode) == (before.st_uid, before.st_mode)  # the target was not touched
    (tmp_path / "file").write_text("x")
    with pytest.raises(RunError, match=r"cannot open folder .*file"):
        prepare_owned_dir(tmp_path / "file", alice)


def test_write_no_follow_replaces_a_planted_symlink(tmp_path: Path) -> None:
    victim = tmp_path / "shadow"
    victim.write_text("root:secret\n")
    folder = tmp_path / "job"
    folder.mkdir()
    (folder / "spec.json").symlink_to(victim)  # what a user could plant in a folder they own
    (folder / ".spec.json.deskpod-tmp").symlink_to(victim)  # and at the temporary name
    write_no_follow(folder / "spec.json", b'{"ok": true}', mode=0o640)
    assert victim.read_text() == "root:secret\n"
    written = folder / "spec.json"
    assert not written.is_symlink() and written.read_bytes() == b'{"ok": true}'
    assert stat.S_IMODE(written.stat().st_mode) == 0o640
    assert sorted(p.name for p in folder.iterdir()) == ["spec.json"]


def test_write_no_follow_refuses_a_symlinked_folder(tmp_path: Path) -> None:
    elsewhere = tmp_path / "etc"
    elsewhere.mkdir()
    (tmp_path / "job").symlink_to(elsewhere)
    with pytest.raises(RunError, match=r"symbolic link"):
        write_no_follow(tmp_path / "job" / "spec.json", b"x")
    assert list(elsewhere.iterdir()) == []


def test_as_account_opens_paths_with_the_accounts_rights_only(two_users: tuple[Account, Account]) -> None:
    alice, bob = two_users
    tmp_path = Path(tempfile.mkdtemp(prefix="deskpod-as-"))  # pytest's own folder is closed to other accounts
    try:
        _as_account_checks(tmp_path, alice, bob)
    finally:
        shutil.rmtree(tmp_path)


def _as_account_checks(tmp_path: Path, alice: Account, bob: Account) -> None:
    private = tmp_path / "bob-home"
    (private / "photos").mkdir(parents=True)
    (private / "photos" / "a.txt").write_text("bob's")
    os.chown(private, bob.uid, bob.gid)
    private.chmod(0o700)  # the folder inside is 0755 and its file 0644: only the closed parent keeps alice out
    tmp_path.chmod(0o755)
    shared = tmp_path / "shared.txt"
    shared.write_text("everyone's")

    def read(path: Path) -> str:
        with open(path) as f:
            return f.read()

    assert as_account(alice, lambda: read(shared)) == "everyone's"
    with pytest.raises(PermissionError):
        as_account(alice, lambda: read(private / "photos" / "a.txt"))
    assert as_account(bob, lambda: read(private / "photos" / "a.txt")) == "bob's"
    assert read(private / "photos" / "a.txt") == "bob's"  # the caller's own rights are untouched
    fd = as_account(bob, lambda: os.open(private / "photos", os.O_RDONLY | os.O_DIRECTORY))
    try:
        assert os.listdir(fd) == ["a.txt"]  # a descriptor opened as bob outlives the check
    finally:
        os.close(fd)
