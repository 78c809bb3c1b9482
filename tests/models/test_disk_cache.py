"""The cache's building blocks: a lock that dies with its owner and bounds its wait, and a
manifest that catches truncated and overwritten files."""

import os
import signal
import time

import pytest

from metagen.models.disk_cache import EntryLock, manifest_problem, write_manifest

@pytest.fixture
def holder(tmp_path, lock_holder):
    return lock_holder(tmp_path / "entry")


def test_empty_lock_files_do_not_block(tmp_path):
    """Empty lock files (ours, and the `lock` baton torch's builder leaves when killed) are free."""
    entry = tmp_path / "entry"
    entry.mkdir()
    (entry / "lock").touch()
    (tmp_path / "entry.lock").touch()
    start = time.monotonic()
    with EntryLock(entry) as lock:
        assert lock.acquire(5, "a test")
    assert time.monotonic() - start < 1


def test_lock_of_a_killed_holder_is_free(tmp_path, lock_holder):
    process = lock_holder(tmp_path / "entry")
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    start = time.monotonic()
    with EntryLock(tmp_path / "entry") as lock:
        assert lock.acquire(5, "a test")
    assert time.monotonic() - start < 1


def test_live_holder_is_waited_for_with_a_message_and_a_bound(tmp_path, holder, capfd):
    start = time.monotonic()
    with EntryLock(tmp_path / "entry") as lock:
        assert not lock.acquire(1.0, "converting a test model")
    assert 1.0 <= time.monotonic() - start < 5
    message = capfd.readouterr().err
    assert f"waiting for process {holder.pid} to finish converting a test model" in message
    assert str(tmp_path / "entry.lock") in message and "giving up after 1 s" in message


def test_lock_is_free_again_once_released(tmp_path):
    with EntryLock(tmp_path / "entry") as first:
        assert first.acquire(0, "a test")
        with EntryLock(tmp_path / "entry") as second:
            assert not second.acquire(0, "a test")
    with EntryLock(tmp_path / "entry") as third:
        assert third.acquire(0, "a test")


@pytest.fixture
def entry(tmp_path):
    directory = tmp_path / "entry"
    (directory / "sub").mkdir(parents=True)
    (directory / "weights.bin").write_bytes(bytes(range(256)) * 100)
    (directory / "sub" / "config.json").write_text('{"a": 1}')
    write_manifest(directory, note="facts are kept")
    return directory


def test_intact_entry_has_no_problem(entry):
    assert manifest_problem(entry) is None


def test_truncated_file_is_named_with_both_sizes(entry):
    path = entry / "weights.bin"
    path.write_bytes(path.read_bytes()[:1000])
    assert manifest_problem(entry) == f"{path} has 1000 bytes, but 25600 were written"


def test_overwritten_bytes_fail_the_checksum(entry):
    path = entry / "sub" / "config.json"
    path.write_text('{"a": 2}')  # same size
    assert manifest_problem(entry).startswith(f"{path} does not match the checksum")


@pytest.mark.parametrize("manifest, expected", [(None, "is missing"), ("{", "is unreadable"), ("[]", "is unreadable")])
def test_missing_or_garbled_manifest(entry, manifest, expected):
    if manifest is None:
        (entry / "manifest.json").unlink()
    else:
        (entry / "manifest.json").write_text(manifest)
    assert expected in manifest_problem(entry)


def test_missing_file_and_missing_entry(entry, tmp_path):
    (entry / "weights.bin").unlink()
    assert manifest_problem(entry) == f"{entry / 'weights.bin'} is missing"
    assert manifest_problem(tmp_path / "absent") == f"{tmp_path / 'absent'} does not exist"
