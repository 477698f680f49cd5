"""A training run's checkpoints, whatever the algorithm: what ``gper train`` writes to
``<run folder>/checkpoints/step-<env step:012d>/`` and what ``--resume`` reads back.

A checkpoint directory holds two files, complete together or not at all
(:func:`gper.training.checkpoints.write_checkpoint`):

- ``trainer.pt``: everything but the replay buffer: the learner's state
  (:meth:`~gper.training.algorithm.Learner.state_dict` without the replay; DQN's: the networks,
  optimizer, device counters, loss sums, beta, episode records, observations and environment
  state), torch's random generator states, the collection iteration, the returns of the episodes
  so far, the report's state, the length of ``metrics.jsonl``, the replay's counts, the algorithm's
  name and the settings;
- ``replay.safetensors``: the replay buffer (its ``save`` and ``load``: streamed a chunk at a time,
  checked whole before anything is copied, nothing unpickled).

A data-parallel run (:mod:`gper.training.parallel`) writes one pair per rank into the same directory:
rank 0's under these names (its ``trainer.pt`` also records the world size), rank ``r``'s as
``trainer.rank<r>.pt`` and ``replay.rank<r>.safetensors`` (its learner, environments, generators and
replay shard; the networks and optimizer are the same on every rank). Every rank writes its own
files into the temporary directory, rank 0 renames it into place once all have written: the
directory is complete for every rank or for none. It resumes only at the world size that wrote it.

``trainer.pt`` is read with ``torch.load(weights_only=True)`` (tensors and plain containers, never
code), ``replay.safetensors`` is a safetensors file (:mod:`gper.replay.files`), read without unpickling.
With the same settings a resumed run computes what the uninterrupted run computes: on the CPU
the same parameters bit for bit. A checkpoint that cannot be read, lacks a file or holds the
wrong content is refused with a :class:`~gper.training.checkpoints.CheckpointError` naming the
file and what is wrong.
"""

from __future__ import annotations

import dataclasses
import math
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gper.training.algorithm import AlgorithmSpec, Learner
from gper.training.checkpoints import (
    TEMP_PREFIX,
    CheckpointError,
    checkpoint_name,
    finish_checkpoint,
    list_checkpoints,
    start_checkpoint,
    step_of,
    write_checkpoint,
    write_files,
)
from gper.training.parallel import Launch
from gper.training.report import RunReport
from gper.training.settings import RUN_FREE, RUN_HONOURED

#: the run folder's subfolder of checkpoints
CHECKPOINTS = "checkpoints"
TRAINER, REPLAY = "trainer.pt", "replay.safetensors"
#: the layout of trainer.pt; a checkpoint of another one is refused
FORMAT = 1
#: the algorithm of a checkpoint written before trainer.pt recorded its algorithm: all of them were DQN's
UNNAMED = "dqn"

#: the replay's counts that trainer.pt records, so a replay.safetensors of another step is refused
#: (the flat replay counts its cursor, the trajectory replay its steps: each records those it has)
REPLAY_COUNTS = ("size", "cursor", "steps", "rng_offset")


def rank_files(rank: int) -> tuple[str, str]:
    """The (trainer, replay) file names of rank ``rank`` in a checkpoint directory (rank 0's:
    :data:`TRAINER`, :data:`REPLAY`)."""
    if rank == 0:
        return TRAINER, REPLAY
    return f"trainer.rank{rank}.pt", f"replay.rank{rank}.safetensors"


def honoured_settings(spec: AlgorithmSpec) -> tuple[str, ...]:
    """The settings a resumed run of ``spec`` takes from its own configuration."""
    return RUN_HONOURED + spec.honoured


def fixed_settings(spec: AlgorithmSpec) -> tuple[str, ...]:
    """The settings a resumed run of ``spec`` must share with its checkpoint (they set shapes or the method)."""
    free = honoured_settings(spec) + RUN_FREE + spec.free
    return tuple(f.name for f in dataclasses.fields(spec.settings) if f.name not in free)


@dataclass
class Checkpoint:
    """A checkpoint read back: its directory, the complete one before it, and ``trainer.pt``."""

    path: Path
    """the checkpoint's directory"""
    state: dict[str, Any]
    """what trainer.pt holds"""
    previous: Path | None = None
    """the complete checkpoint before it in its folder (to fall back to by hand), if any"""

    @property
    def run_folder(self) -> Path | None:
        """The run folder it belongs to (None for a directory outside a ``checkpoints`` folder)."""
        return self.path.parent.parent if self.path.parent.name == CHECKPOINTS else None

    def settings(self, spec: AlgorithmSpec) -> dict[str, Any]:
        """The settings of the run that wrote it, in today's form (:attr:`AlgorithmSpec.upgrade`:
        a setting it predates holds the value it ran with)."""
        return spec.upgrade(dict(self.state["config"]))

    @property
    def iteration(self) -> int:
        """Collection iterations done."""
        return self.state["iteration"]

    def refuse(self, path: Path, what: str) -> CheckpointError:
        """The error for a damaged file ``path`` of this checkpoint, naming the one to fall back to."""
        hint = f"; the checkpoint before it is {self.previous}" if self.previous is not None else ""
        return CheckpointError(f"{path}: {what}{hint}")


#: what trainer.pt holds, with the type of each entry
_TRAINER_ENTRIES = {
    "format": int,
    "agent": dict,
    "rng": dict,
    "iteration": int,
    "returns": list,
    "report": dict,
    "metrics_bytes": int,
    "replay_counts": dict,
    "config": dict,
}


def find(resume: str | Path) -> Path:
    """The checkpoint directory ``resume`` names: a checkpoint directory itself, or the newest
    complete checkpoint of a run folder (directories a killed writer left are ignored).

    Raises:
        CheckpointError: ``resume`` is neither, or the run folder holds no complete checkpoint.
    """
    path = Path(resume)
    if not path.exists():
        raise CheckpointError(f"{path}: no such run folder or checkpoint directory")
    if not path.is_dir():
        raise CheckpointError(
            f"{path} is a file: resume from a run folder or a checkpoint directory (<run folder>/{CHECKPOINTS}/step-N)"
        )
    if step_of(path) is not None:
        return path
    if path.name.startswith(TEMP_PREFIX):
        raise CheckpointError(f"{path} is a checkpoint whose writing never finished: resume from its run folder")
    found = list_checkpoints(path / CHECKPOINTS)
    if not found:
        raise CheckpointError(f"{path}: no complete checkpoint in {path / CHECKPOINTS}")
    return found[-1]


def read(resume: str | Path, rank: int = 0, world_size: int | None = None) -> Checkpoint:
    """The checkpoint ``resume`` names (see :func:`find`), its ``trainer.pt`` read and checked; in a
    data-parallel run, rank ``rank``'s files of it (:func:`rank_files`), for a group of ``world_size``
    (None: any world size, to read its settings).

    A damaged checkpoint is refused, not skipped: a complete one is never left damaged by a
    crash, so damage means the disk or someone changed it; the message names the checkpoint
    before it, to resume from instead.

    Raises:
        CheckpointError: one line naming the file and what is wrong, or the world size that wrote
            it when it is not ``world_size`` (on every rank alike: they all read rank 0's ``trainer.pt``).
    """
    path = find(resume)
    older = [p for p in list_checkpoints(path.parent) if step_of(p) < step_of(path)]
    ckpt = Checkpoint(path, {}, older[-1] if older else None)
    state = _read_trainer(ckpt, path / TRAINER)
    saved = state.get("world_size", 1)
    if world_size is not None and saved != world_size:
        raise CheckpointError(
            f"{path} was written by a run of {saved} process{'es' if saved != 1 else ''}, this one has {world_size}: "
            "a checkpoint resumes only at the world size that wrote it (each rank's replay shard is its own; "
            f"re-sharding is not supported): launch {saved} process{'es' if saved != 1 else ''}"
        )
    trainer_name, replay_name = rank_files(rank)
    if rank != 0:
        state = _read_trainer(ckpt, path / trainer_name)
        if state.get("rank") != rank:
            raise ckpt.refuse(
                path / trainer_name, f"wrong content: it is rank {state.get('rank')}'s, not rank {rank}'s"
            )
    if not (path / replay_name).is_file():
        raise ckpt.refuse(path / replay_name, "missing")
    ckpt.state = state
    return ckpt


def _read_trainer(ckpt: Checkpoint, trainer: Path) -> dict[str, Any]:
    """A trainer file of ``ckpt``, read and checked."""
    path = ckpt.path
    state = _load(ckpt, trainer, "cpu")
    if not isinstance(state, dict):
        raise ckpt.refuse(trainer, f"holds a {type(state).__name__}, not a trainer checkpoint")
    for key, kind in _TRAINER_ENTRIES.items():
        if not isinstance(state.get(key), kind):
            raise ckpt.refuse(trainer, f"wrong content: {key!r} missing or not a {kind.__name__}")
    if state["format"] != FORMAT:
        raise ckpt.refuse(trainer, f"checkpoint format {state['format']}, this gper reads format {FORMAT}")
    num_envs = state["config"].get("num_envs")
    if not isinstance(num_envs, int) or state["iteration"] * num_envs != step_of(path):
        raise ckpt.refuse(trainer, f"wrong content: it is not the checkpoint of env step {step_of(path)}")
    return state


def stored_settings(spec: AlgorithmSpec, resume: str | Path) -> Any:
    """The settings of the checkpoint ``resume`` names, as the settings object of ``spec`` to resume
    it with: ``run_dir`` and ``run_name`` are the defaults (so the run continues in the checkpoint's
    run folder) and ``resume`` is ``resume``. ``gper train --resume`` starts from these; the flags
    given change them."""
    ckpt = read(resume)
    names = {f.name for f in dataclasses.fields(spec.settings)} - {"run_dir", "run_name", "resume"}
    settings = {k: v for k, v in ckpt.settings(spec).items() if k in names}
    return spec.settings_of(settings | {"resume": str(resume)})


def check_settings(spec: AlgorithmSpec, cfg: Any, ckpt: Checkpoint) -> None:
    """Refuse to resume ``ckpt`` with ``cfg`` (resolved settings of ``spec``) when it was written by
    another algorithm, when a fixed setting differs, or when ``total_steps`` is behind the checkpoint.

    Raises:
        ValueError: one line naming the algorithm, or listing every differing setting with the
            checkpoint's value.
    """
    algorithm = ckpt.state.get("algorithm", UNNAMED)
    if algorithm != spec.name:
        raise ValueError(f"cannot resume {ckpt.path} with {spec.name}: it is a checkpoint of {algorithm}")
    ours, theirs = dataclasses.asdict(cfg), ckpt.settings(spec)
    missing = object()
    differ = [name for name in fixed_settings(spec) if theirs.get(name, missing) != ours[name]]
    if differ:
        changes = ", ".join(f"{name} {ours[name]!r} (checkpoint: {theirs.get(name, 'not set')!r})" for name in differ)
        raise ValueError(
            f"cannot resume {ckpt.path} with other settings: {changes}; a resumed run may change "
            f"{' and '.join(honoured_settings(spec))}, and where it runs and what it writes, not its shapes or method"
        )
    if math.ceil(cfg.total_steps / cfg.num_envs) < ckpt.iteration:
        raise ValueError(
            f"cannot resume {ckpt.path}: total_steps {cfg.total_steps} is below its env step "
            f"{ckpt.iteration * cfg.num_envs}"
        )


def save(
    spec: AlgorithmSpec, learner: Learner, iteration: int, report: RunReport, launch: Launch | None = None
) -> Path:
    """Write the checkpoint of ``learner`` (an algorithm of ``spec``) after ``iteration`` collection
    iterations to the run folder of ``report``, keeping the newest ``keep_checkpoints``; return its
    directory. With ``launch`` (a data-parallel run) a collective: every rank writes its own files
    (see the module docstring)."""
    cfg, runlog = report.cfg, report.runlog
    counts = learner.rb.stats()  # also brings the buffer's host view of its size up to date
    if launch is not None:
        counts = counts["shard"]
    state = {
        "format": FORMAT,
        "algorithm": spec.name,
        "agent": learner.state_dict(replay=False),  # "agent": the name format 1 has always had
        "rng": _rng_state(learner.device),
        "iteration": iteration,
        "returns": list(report.returns),
        "report": report.state_dict(),
        "metrics_bytes": runlog.metrics_bytes(),
        "replay_counts": _replay_counts(counts),
        "config": dataclasses.asdict(cfg),
    }
    folder, step = runlog.folder / CHECKPOINTS, iteration * cfg.num_envs
    if launch is None:
        files = {TRAINER: lambda path: torch.save(state, path), REPLAY: learner.rb.save}
        return write_checkpoint(folder, step, files, keep=cfg.keep_checkpoints)
    return _save_ranks(learner, state, folder, step, launch, cfg.keep_checkpoints)


def _save_ranks(learner: Learner, state: dict[str, Any], folder: Path, step: int, launch: Launch, keep: int) -> Path:
    """Every rank's files into one temporary directory, which rank 0 renames into place once all are written."""
    state |= {"world_size": launch.world_size, "rank": launch.rank}
    trainer_name, replay_name = rank_files(launch.rank)

    def replay(path: Path) -> None:  # first: trainer.pt records the group's part of the replay's state
        state["replay_group"] = learner.rb.save(path)

    files = {replay_name: replay, trainer_name: lambda path: torch.save(state, path)}
    tmp = folder / f"{TEMP_PREFIX}{checkpoint_name(step)}"
    launch.agree(lambda: start_checkpoint(folder, step) if launch.main else None, "starting a checkpoint")
    try:
        launch.agree(lambda: write_files(tmp, files), f"writing the checkpoint files of step {step}")
        final = launch.agree(lambda: finish_checkpoint(tmp, keep) if launch.main else None, "completing a checkpoint")
    except BaseException:
        if launch.main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final if final is not None else folder / checkpoint_name(step)


def restore(learner: Learner, ckpt: Checkpoint, launch: Launch | None = None) -> None:
    """Load ``ckpt`` into ``learner`` (built with the settings :func:`check_settings` accepted), its
    replay included, and torch's random generators; then the learner applies the settings a resumed
    run honours (:meth:`~gper.training.algorithm.Learner.honour_settings`: DQN's Adam runs at the
    new learning rate).
    With ``launch`` (a data-parallel run, ``ckpt`` read for this rank) a collective: each rank loads
    its own files, and a file refused on one rank is an error on every rank.

    Raises:
        CheckpointError: a file cannot be read or does not fit the learner.
    """
    if launch is None:
        _restore_trainer(learner, ckpt, ckpt.path / TRAINER)
        _restore_replay(learner, ckpt, None)
        return
    launch.agree(
        lambda: _restore_trainer(learner, ckpt, ckpt.path / rank_files(launch.rank)[0]), "restoring a checkpoint"
    )
    launch.agree(lambda: _restore_replay(learner, ckpt, launch), "restoring a checkpoint's replay")


def _restore_trainer(learner: Learner, ckpt: Checkpoint, trainer: Path) -> None:
    state = ckpt.state
    try:
        learner.load_state_dict(state["agent"], replay=False)
        _set_rng_state(state["rng"], learner.device)
    except (KeyError, RuntimeError, TypeError, ValueError) as err:
        raise ckpt.refuse(trainer, f"wrong content: {_one_line(err)}") from None
    learner.honour_settings()


def _restore_replay(learner: Learner, ckpt: Checkpoint, launch: Launch | None) -> None:
    state = ckpt.state
    replay = ckpt.path / rank_files(0 if launch is None else launch.rank)[1]
    if not replay.is_file():
        raise ckpt.refuse(replay, "missing")
    try:
        if launch is None:
            learner.rb.load(replay)
        else:
            # the group's part is checked on every rank alike (a collective) before the shard is read
            learner.rb.load(replay, state.get("replay_group", {}))
    except Exception as err:
        raise ckpt.refuse(replay, f"cannot be loaded: {_one_line(err)}") from None
    # the shard's own counts (the sharded buffer's stats() would be a collective)
    found = _replay_counts(learner.rb.stats() if launch is None else learner.rb.shard.stats())
    if found != state["replay_counts"]:
        raise ckpt.refuse(replay, f"wrong content: counts {found}, trainer.pt says {state['replay_counts']}")


def _replay_counts(stats: dict[str, Any]) -> dict[str, int | list[int]]:
    """The :data:`REPLAY_COUNTS` among a replay's ``stats()`` (a buffer of several instances: a list
    of each instance's)."""

    def count(value: Any) -> int | list[int]:
        return [int(v) for v in value] if isinstance(value, list) else int(value)

    return {name: count(stats[name]) for name in REPLAY_COUNTS if name in stats}


def _load(ckpt: Checkpoint, path: Path, map_location: str | torch.device) -> Any:
    if not path.is_file():
        raise ckpt.refuse(path, "missing")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # truncated, not a torch file, or holding more than tensors
        raise ckpt.refuse(path, f"cannot be read: {_one_line(err)}") from None


def _rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    # the collect step's draws (DQN's epsilon-greedy) and the device environments' resets come from
    # torch's default generators (seeded once in setup)
    state = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict[str, torch.Tensor], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def _one_line(err: BaseException, limit: int = 300) -> str:
    """What ``err`` says, on one line: its first sentence, or what a refused unpickling found."""
    text = " ".join(str(err).split())
    if isinstance(err, EOFError):
        return "cut short (end of file)"
    if isinstance(err, OSError):  # what reading a file cut short in the middle of a record raises
        return f"cut short or damaged ({text})"
    refused = re.search(r"Unsupported global: GLOBAL (\S+)", text)
    if refused:  # weights_only: the file holds an object of a class, which is never unpickled
        return f"holds {refused.group(1)}, more than tensors and plain containers"
    text = text.split(". ")[0].rstrip(".") or type(err).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
