"""What :class:`gper.integrations.torchrl.PrioritizedReplayBuffer` saves and restores: its keys, its
batch size and gper's buffer, as a state dict (``state_dict`` / ``load_state_dict``), as a directory
(``dumps`` / ``loads``: ``keys.json`` beside gper's streamed ``buffer.safetensors``), and through pickle."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gper
from gper._files import atomic_file
from gper.integrations._tensordict import KeyLayout
from gper.replay.checks import check_batch_size
from gper.replay.files import TensorFile

#: what ``dumps`` writes into its directory: the keys, and gper's buffer file
_KEYS_FILE, _BUFFER_FILE = "keys.json", "buffer.safetensors"
_FORMAT = "gper.integrations.torchrl/1"


class TorchRLState:
    """The saving and restoring half of the TorchRL adapter; the adapter holds the attributes it
    reads (``_rb``, ``_layout``, ``_batch_size``, ``_args``) and provides ``empty`` and ``_new_state``."""

    _rb: gper.PrioritizedReplayBuffer | None
    _layout: KeyLayout | None
    _batch_size: int | None
    _args: dict[str, Any]

    def _keys_record(self) -> list | None:
        return None if self._layout is None else self._layout.record()

    def _parse_keys(self, record: object, what: str) -> KeyLayout | None:
        """The layout a saved record describes (None: saved without data), which must be this buffer's."""
        if record is None:
            return None
        layout = KeyLayout.parse(record, what)
        if self._layout is not None and layout != self._layout:
            raise ValueError(f"{what}: the state holds keys {record!r}, this buffer {self._keys_record()!r}")
        return layout

    def state_dict(self) -> dict[str, Any]:
        """The stored keys, the batch size and gper's state (its tensors are the buffer's own, not copies)."""
        buffer = None if self._rb is None else self._rb.state_dict()
        return {"format": _FORMAT, "keys": self._keys_record(), "batch_size": self._batch_size, "buffer": buffer}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` (alpha, beta and eps become the saved ones, as in TorchRL).

        Raises:
            ValueError: another format, other keys, or a state gper refuses; nothing changes then.
        """
        what = "load_state_dict()"
        if not isinstance(state, dict) or state.get("format") != _FORMAT:
            raise ValueError(f"{what}: not a state of gper.integrations.torchrl.PrioritizedReplayBuffer")
        layout = self._parse_keys(state.get("keys"), what)
        buffer = state.get("buffer")
        config = buffer.get("config") if isinstance(buffer, dict) else None
        self._restore(layout, config, lambda rb: rb.load_state_dict(buffer), state.get("batch_size"), what)

    def dumps(self, path: str | os.PathLike) -> None:
        """Write the buffer to directory ``path``: ``keys.json`` and gper's ``buffer.safetensors``
        (streamed a chunk at a time, written atomically; nothing pickled)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        record = {
            "format": _FORMAT,
            "keys": self._keys_record(),
            "batch_size": self._batch_size,
            "buffer": self._rb is not None,
        }
        with atomic_file(path / _KEYS_FILE) as f:
            f.write(json.dumps(record).encode())
        if self._rb is not None:
            self._rb.save(path / _BUFFER_FILE)

    def loads(self, path: str | os.PathLike) -> None:
        """Restore what :meth:`dumps` wrote to ``path``, with the checks of :meth:`load_state_dict`."""
        what, path = "loads()", Path(path)
        try:
            record = json.loads((path / _KEYS_FILE).read_text())
        except (OSError, ValueError) as err:
            raise ValueError(f"{what}: {path / _KEYS_FILE} is missing or damaged ({err})") from err
        if not isinstance(record, dict) or record.get("format") != _FORMAT:
            raise ValueError(f"{what}: {path} was not written by gper.integrations.torchrl")
        layout = self._parse_keys(record.get("keys"), what)
        config = None
        if record.get("buffer") and layout is not None:
            with TensorFile(path / _BUFFER_FILE) as f:  # the settings it was saved with, to adopt
                config = f.metadata.get("config")
        load = lambda rb: rb.load(path / _BUFFER_FILE)
        self._restore(layout if record.get("buffer") else None, config, load, record.get("batch_size"), what)

    def _restore(
        self,
        layout: KeyLayout | None,
        config: object,
        load: Callable[[gper.PrioritizedReplayBuffer], None],
        batch_size: object,
        what: str,
    ) -> None:
        """Load into the current buffer (or a new one of ``layout``), adopting alpha, beta and eps
        of ``config``; any failure leaves everything as it was."""
        if batch_size is not None:
            batch_size = check_batch_size(batch_size)
        if layout is None:  # saved before any extend, or emptied
            self.empty()
            self._batch_size = batch_size
            return
        saved = {k: self._args[k] for k in ("alpha", "beta", "eps")}
        rb = self._rb
        if rb is None:
            rb = gper.PrioritizedReplayBuffer(spec=layout.spec(), **self._args)
        try:
            if isinstance(config, dict):
                for k in saved:
                    if k in config:
                        setattr(rb, k, config[k])
            load(rb)
        except BaseException:
            for k, v in saved.items():
                setattr(rb, k, v)
            raise
        self._rb, self._layout, self._batch_size = rb, layout, batch_size
        self._args.update({k: getattr(rb, k) for k in saved})
        self._new_state()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_source"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._new_state()  # samples drawn from the original do not update the copy
