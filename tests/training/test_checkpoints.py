"""Checkpoint directories and files that a crash cannot leave half-written: the order of fsyncs
and renames, a writer that fails half-way, what killed writers leave, pruning."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gper.training import checkpoints
from gper.training.checkpoints import (
    TEMP_PREFIX,
    atomic_write,
    checkpoint_name,
    list_checkpoints,
    prune,
    remove_temporaries,
    step_of,
    write_checkpoint,
)


def _text(content: str):
    return lambda path: path.write_text(content)


def _fails(path: Path) -> None:
    path.write_text("half of it")
    raise OSError("disk full")


def test_names_and_steps():
    assert checkpoint_name(1200) == "step-000000001200" and step_of("a/step-000000001200") == 1200
    assert step_of(f"{TEMP_PREFIX}step-000000001200") is None and step_of("step-12") is None
    with pytest.raises(ValueError):
        checkpoint_name(-1)


def _bytes(content: str):
    return lambda f: f.write(content.encode())


def _fails_midway(f) -> None:
    f.write(b"half of it")
    raise OSError("disk full")


def test_atomic_write_keeps_the_old_file_when_the_writer_fails(tmp_path):
    path = tmp_path / "config.json"
    atomic_write(path, _bytes("old"))
    with pytest.raises(OSError, match="disk full"):
        atomic_write(path, _fails_midway)
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["config.json"]
    atomic_write(path, _bytes("new"))
    assert path.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["config.json"]


def test_a_checkpoint_is_fsynced_file_by_file_then_renamed_then_its_folder_fsynced(tmp_path, monkeypatch):
    events = []
    monkeypatch.setattr(checkpoints, "fsync_path", lambda path: events.append(("fsync", Path(path).name)))
    real_replace = checkpoints.os.replace

    def replace(src, dst):
        events.append(("rename", Path(src).name, Path(dst).name))
        real_replace(src, dst)

    monkeypatch.setattr(checkpoints.os, "replace", replace)  # os itself: restored after the test
    path = write_checkpoint(tmp_path, 40, {"trainer.pt": _text("t"), "replay.safetensors": _text("r")})
    tmp = f"{TEMP_PREFIX}step-000000000040"
    assert events == [
        ("fsync", "trainer.pt"),
        ("fsync", "replay.safetensors"),
        ("fsync", tmp),
        ("rename", tmp, "step-000000000040"),
        ("fsync", tmp_path.name),
    ]
    assert path == tmp_path / "step-000000000040" and (path / "replay.safetensors").read_text() == "r"


def test_a_writer_that_fails_leaves_the_previous_checkpoint_the_newest(tmp_path):
    write_checkpoint(tmp_path, 10, {"trainer.pt": _text("10"), "replay.safetensors": _text("10")}, keep=1)
    with pytest.raises(OSError, match="disk full"):
        write_checkpoint(tmp_path, 20, {"trainer.pt": _text("20"), "replay.safetensors": _fails}, keep=1)
    assert [p.name for p in tmp_path.iterdir()] == ["step-000000000010"]
    assert (tmp_path / "step-000000000010" / "replay.safetensors").read_text() == "10"


def test_what_a_killed_writer_left_is_ignored_then_removed(tmp_path):
    write_checkpoint(tmp_path, 10, {"trainer.pt": _text("10")})
    left = tmp_path / f"{TEMP_PREFIX}step-000000000020"  # a writer killed before its rename
    left.mkdir()
    (left / "trainer.pt").write_text("20")
    assert list_checkpoints(tmp_path) == [tmp_path / "step-000000000010"]
    assert remove_temporaries(tmp_path) == [left] and not left.exists()
    # and a writer of the same step clears it before it starts
    left.mkdir()
    (left / "stale").write_text("")
    write_checkpoint(tmp_path, 20, {"trainer.pt": _text("20")})
    assert sorted(p.name for p in (tmp_path / "step-000000000020").iterdir()) == ["trainer.pt"]


def test_pruning_keeps_the_newest_and_drops_an_abandoned_future(tmp_path):
    for step in (10, 20, 30, 40, 50):
        write_checkpoint(tmp_path, step, {"trainer.pt": _text(str(step))}, keep=2)
        assert len(list_checkpoints(tmp_path)) == min(2, step // 10)
    assert [step_of(p) for p in list_checkpoints(tmp_path)] == [40, 50]
    # resumed from 40 by hand: writing 45 drops 50, which this run will write again
    write_checkpoint(tmp_path, 45, {"trainer.pt": _text("45")}, keep=3)
    assert [step_of(p) for p in list_checkpoints(tmp_path)] == [40, 45]
    with pytest.raises(ValueError):
        prune(tmp_path, 0, tmp_path / "step-000000000045")


def test_the_same_step_written_again_replaces_it(tmp_path):
    write_checkpoint(tmp_path, 10, {"trainer.pt": _text("first")})
    write_checkpoint(tmp_path, 10, {"trainer.pt": _text("second")})
    assert [p.name for p in tmp_path.iterdir()] == ["step-000000000010"]
    assert (tmp_path / "step-000000000010" / "trainer.pt").read_text() == "second"


def test_the_pause_for_crash_tests_comes_after_every_file(tmp_path, monkeypatch):
    slept = []
    monkeypatch.setattr(checkpoints.time, "sleep", slept.append)
    write_checkpoint(tmp_path, 10, {"a": _text("a"), "b": _text("b")})
    assert slept == []
    monkeypatch.setenv(checkpoints.PAUSE_ENV, "0.25")
    write_checkpoint(tmp_path, 20, {"a": _text("a"), "b": _text("b")})
    assert slept == [0.25, 0.25]


def test_a_crash_between_the_renames_of_a_rewritten_step_keeps_that_step(tmp_path, monkeypatch):
    """Writing step N again moves the old step-N aside as step-N.replaced first: a crash before
    the new one is renamed in leaves step-N.replaced, which counts as step N's checkpoint."""
    write_checkpoint(tmp_path, 40, {"trainer.pt": _text("first")})
    real = os.replace
    calls = []

    def crash_on_second(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise KeyboardInterrupt("killed between the renames")
        return real(src, dst)

    monkeypatch.setattr(os, "replace", crash_on_second)
    with pytest.raises(KeyboardInterrupt):
        write_checkpoint(tmp_path, 40, {"trainer.pt": _text("second")})
    monkeypatch.setattr(os, "replace", real)
    (found,) = list_checkpoints(tmp_path)
    assert found.name == "step-000000000040.replaced" and step_of(found) == 40
    assert (found / "trainer.pt").read_text() == "first"
    remove_temporaries(tmp_path)  # what a resume does first: the copy moved aside stays
    assert list_checkpoints(tmp_path) == [found]
    path = write_checkpoint(tmp_path, 40, {"trainer.pt": _text("third")}, keep=2)
    assert list_checkpoints(tmp_path) == [path] and (path / "trainer.pt").read_text() == "third"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000000000040"]
