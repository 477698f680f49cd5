"""The per-environment defaults that :class:`gper.dqn.Config`'s ``None`` fields stand for, per
device type (:func:`gper.dqn.config.resolve` fills them in; ``gper train --help`` lists them).

Each environment's registration holds its own (:class:`gper.envs.EnvSpec`); :data:`PRESETS` is the
registry's table of them, by preset family, kept up to date as environments register.
"""

from __future__ import annotations

from gper.envs.registry import PRESETS

__all__ = ["PRESETS"]
