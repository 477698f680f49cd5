"""A trajectory buffer's per-stream state and the stream kernels that read it: :class:`StreamState`."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from gper.ops import kernels as kernels_of
from gper.ops.trajectory.reference import AUTORESET, N_TCOUNTERS
from gper.replay.core import ReplayCore
from gper.replay.streams import STEP_FLAGS, StepPacker, StreamLayout


class StreamState:
    """The streams of a trajectory buffer beside its :class:`ReplayCore`: where each stands, the
    step it holds back, its counts, and the kernels that add steps, gather sequences and stack frames.

    Args:
        layout: the rows' and steps' layout.
        num_envs, rows_per_env, window: the streams, the rows of each, the longest look-ahead.
        autoreset: a key of ``AUTORESET``.
        core: the core whose tree and rows the streams fill.

    Attributes:
        streams: [E, 2] int64: rows written per stream, and where its episode in progress starts.
        last_next_obs: [E, W] int32: the ``next_obs`` given with each stream's last step, packed as
            a row (a state dict's ``pending``): the next step's ``obs`` is compared with it.
        tcounters: [N_TCOUNTERS] int64: steps added and discontinuities seen.
    """

    def __init__(
        self, layout: StreamLayout, num_envs: int, rows_per_env: int, window: int, autoreset: str, core: ReplayCore
    ) -> None:
        device = core.device
        self.layout, self.rows_per_env, self.window, self.autoreset = layout, rows_per_env, window, autoreset
        self.kernels = kernels_of("trajectory", core.backend)
        self.streams = torch.zeros(num_envs, 2, dtype=torch.int64, device=device)
        self.last_next_obs = torch.zeros(num_envs, layout.words, dtype=torch.int32, device=device)
        self.tcounters = torch.zeros(N_TCOUNTERS, dtype=torch.int64, device=device)
        self.obs_mask = layout.obs_mask(device)
        self._packer = StepPacker(layout, num_envs, device)
        self._plan = self._packer.word_plan() if core.backend == "triton" else None

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"streams": self.streams, "pending": self.last_next_obs, "tcounters": self.tcounters}

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        """Copy a checked state's stream tensors into place."""
        for name, tensor in self.state_dict().items():
            tensor.copy_(state[name])

    def add(self, core: ReplayCore, data: Mapping[str, torch.Tensor]) -> None:
        """Write one step of every stream (``data``: the step's tensors by name) into ``core``."""
        device = core.device
        tree = core.tree
        direct = {}  # the Triton add reads the step's tensors itself where their fields are whole words
        if self._plan is not None:
            keys, plan = self._plan
            staged = None
            flags = tuple(data[n].detach().to(device, non_blocking=True).contiguous() for n in STEP_FLAGS)
            direct = {"sources": tuple(self._packer.words_of(data, keys)), "plan": plan, "flags": flags}
        else:
            staged = self._packer.pack(data)
        self.kernels.stream_add(
            state=tree.state,
            keys=core.policy.rank.keys if core.policy.rank is not None else None,
            rows=core.rows.words,
            staged=staged,
            streams=self.streams,
            pending=self.last_next_obs,
            tcounters=self.tcounters,
            obs_mask=self.obs_mask,
            flags_col=self.layout.flags_col,
            rows_per_env=self.rows_per_env,
            window=self.window,
            autoreset=AUTORESET[self.autoreset],
            value=core.policy.start_value,
            **direct,
        )

    def gather_sequences(
        self,
        rows: torch.Tensor,
        length: int,
        burn_in: int,
        indices: torch.Tensor,
        out_rows: torch.Tensor,
        out_mask: torch.Tensor,
    ) -> None:
        """The rows and mask of the sequences that start at ``indices``, into ``out_rows`` and ``out_mask``."""
        self.kernels.gather_sequences(
            rows=rows,
            streams=self.streams,
            rows_per_env=self.rows_per_env,
            length=length,
            burn_in=burn_in,
            obs_mask=self.obs_mask,
            flags_col=self.layout.flags_col,
            idx=indices,
            out_rows=out_rows,
            out_mask=out_mask,
        )

    def stack_frames(self, rows: torch.Tensor, n_step: int, parts: Mapping[str, torch.Tensor]) -> None:
        """The frame stacks of the n-step transitions drawn into ``parts`` (their ``indices``), into
        its ``obs_stack`` and ``next_stack``."""
        self.kernels.stack_frames(
            rows=rows,
            streams=self.streams,
            rows_per_env=self.rows_per_env,
            n_step=n_step,
            flags_col=self.layout.flags_col,
            col0=self.layout.stack_span()[0],
            idx=parts["indices"],
            out_obs=parts["obs_stack"],
            out_next=parts["next_stack"],
        )
