"""What ``gper train --help`` shows for the settings whose default is a preset.

:class:`~gper.dqn.config.Config` leaves those settings ``None`` (the environment's preset on the
device that runs). Shown as ``(default: None)`` they say nothing, so the command parses into a
copy of ``Config`` (its :attr:`~gper.dqn.Config.walk` section's settings flat among the others,
as ``--train-months``, ``--steps-per-bar``, ...) whose help hints name the value that will run:
for the ``--env`` and ``--device`` on the command line (cartpole, and this machine's device, when
not given), and the description lists the presets of every environment on both kinds of device.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import typing
from typing import Annotated, Any

import torch

from gper.dqn import config as config_module
from gper.dqn.config import Config, env_family
from gper.dqn.walk_settings import WALK_FIELDS, WalkForward
from gper.envs import registry


def field_docs() -> dict[str, str]:
    """Each :class:`Config` and :class:`~gper.dqn.walk_settings.WalkForward` field's docstring (the
    string under it in the source), one line each; ``env``'s lists the registered environments with
    their help lines."""
    docs = {"env": env_help()}
    for cls in (Config, WalkForward):
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
        except (OSError, TypeError):  # installed without its sources: the flags go without help text
            return docs
        body = tree.body[0].body  # type: ignore[attr-defined]
        for node, nxt in zip(body, body[1:], strict=False):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id not in docs:
                text = nxt.value.value if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) else None
                if isinstance(text, str):
                    docs[node.target.id] = " ".join(text.split())
    return docs


def flat_fields() -> list[tuple[dataclasses.Field, bool]]:
    """:class:`Config`'s fields in order, its ``walk`` section's in its place, each with whether it
    belongs to the section: the command line's settings."""
    walk = [(f, True) for f in dataclasses.fields(WalkForward)]
    return [item for f in dataclasses.fields(Config) for item in (walk if f.name == "walk" else [(f, False)])]


def env_help() -> str:
    """``--env``'s help: every registered environment, with its help line in parentheses."""
    *names, last = [spec.name + (f" ({spec.help})" if spec.help else "") for spec in registry.specs()]
    return "environment: " + (f"{', '.join(names)}, or {last}" if names else last)


def preset(env: str, device: torch.device, family: str | None = None) -> dict[str, Any]:
    """The preset values that ``None`` stands for, for ``env`` (or the preset ``family``) on a device
    of ``device``'s type."""
    return registry.preset(family or env_family(env), device.type) or {}


def _show(value: Any) -> str:
    if isinstance(value, tuple):
        return " ".join(str(v) for v in value)
    if isinstance(value, float) and value.is_integer() and abs(value) >= 1000:
        return str(int(value))
    return str(value)


def presets_table() -> str:
    """Lines listing every preset setting's value per environment, as ``CUDA / CPU``: first the
    settings every environment gives a value to, then the others."""
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    specs = registry.specs()
    values = {spec.name: (preset(spec.name, gpu), preset(spec.name, cpu)) for spec in specs}
    names = dict.fromkeys(n for g, c in values.values() for n in (*g, *c))
    common = [n for n in names if all(g.get(n) is not None for g, _ in values.values())]
    lines = ["presets (a setting left unset takes its environment's value, on CUDA / on the CPU):"]
    for name in dict.fromkeys([*common, *names]):
        cells = []
        for env, (gpu_values, cpu_values) in values.items():
            g, c = gpu_values.get(name), cpu_values.get(name)
            if g is None and c is None:
                continue
            cells.append(f"{env} {_show(g)}" + ("" if c == g else f" / {_show(c)}"))
        if cells:
            lines.append(f"  {name.replace('_', '-')}: " + "; ".join(cells))
    for spec in specs:
        if spec.walk_forward_presets is not None:
            walk = spec.walk_forward_presets["cuda"]
            lines.append(
                f"  {spec.name} walk-forward (--train-months/--val-months/--test-months, or days, or bars), "
                "on CUDA and the CPU: "
                + ", ".join(f"{k.replace('_', '-')} {_show(v)}" for k, v in walk.items() if v is not None)
            )
    for spec in specs:
        lines.extend(f"  {k.replace('_', '-')} for {spec.name}: {note}" for k, note in spec.own_defaults.items())
    lines.append(
        "  threads (CPU only): 1 for a training step under 1 GFLOP (every preset's network), else the cores available"
    )
    return "\n".join(lines)


def command_config(env: str, device: torch.device, default: Config | None = None, walk: bool = False) -> type:
    """A dataclass with :class:`Config`'s fields, defaults and help, whose preset settings' help
    hints name the values that run for ``env`` on ``device``; :func:`to_config` converts its instances.

    With ``default`` (a resumed run's settings), only the settings it leaves ``None`` get a
    preset's hint; tyro shows the others' values as their defaults. With ``walk`` (walk-forward
    windows among the flags), the hints are the ``market-walk`` preset's."""
    import tyro

    hints = typing.get_type_hints(Config, include_extras=True, localns=vars(config_module))
    hints |= typing.get_type_hints(WalkForward, include_extras=True)
    docs = field_docs()
    spec = registry.lookup(env)
    walk = walk and spec is not None and spec.walk_forward_presets is not None
    values = preset(env, device, f"{spec.family}-walk" if walk and spec is not None else None)
    where = ("the CPU" if device.type != "cuda" else "CUDA") + (", walk-forward" if walk else "")
    own_defaults = spec.own_defaults if spec is not None else {}
    if walk:
        values["total_steps"] = "steps-per-bar x each fold's training bars"
        values["epoch_steps"] = "total-steps / validations"
    fields = []
    for f, in_walk in flat_fields():
        hint: str | None = None
        owner = default.walk if default is not None and in_walk else default  # the resumed run's section
        unset = (f.default if owner is None else getattr(owner, f.name)) is None
        if unset and f.name in own_defaults:
            hint = f"(default for --env {env}: {own_defaults[f.name]})"
        elif unset and f.name in values:
            hint = f"(default for --env {env} on {where}: {_show(values[f.name])})"
        elif unset and f.name == "threads":
            hint = "(default: chosen for the network's size, on the CPU)"
        arg = tyro.conf.arg(help=docs.get(f.name), help_behavior_hint=hint)
        spec = dataclasses.field(default=f.default) if f.default is not dataclasses.MISSING else f
        # --sweep is given once per setting swept: --sweep gamma=0.99,0.995 --sweep learning_rate=1e-3,3e-4
        marks = (arg, tyro.conf.UseAppendAction) if f.name == "sweep" else (arg,)
        fields.append((f.name, Annotated[(hints[f.name], *marks)], spec))
    return dataclasses.make_dataclass("Config", fields)


def to_config(parsed: Any) -> Config:
    """The :class:`Config` holding the settings of an instance of a :func:`command_config` class
    (the walk-forward ones gathered into its ``walk`` section)."""
    walk = WalkForward(**{name: getattr(parsed, name) for name in WALK_FIELDS})
    return Config(**{f.name: getattr(parsed, f.name) for f, in_walk in flat_fields() if not in_walk}, walk=walk)


def from_config(cls: type, config: Config) -> Any:
    """An instance of the :func:`command_config` class ``cls`` holding ``config``'s settings."""
    return cls(**{f.name: getattr(config.walk if in_walk else config, f.name) for f, in_walk in flat_fields()})
