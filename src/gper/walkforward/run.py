"""``gper train --env market --train-months ...``: walk-forward training over calendar folds, one
fold after another on one device, and its report.

    gper train --env market --data arch:sp500 --train-months 36 --val-months 12 --test-months 12

The run folder (``<run_dir>/<run_name>``, default ``market-walk__<series>__s<seed>__<time>``) holds
``config.json`` (the settings, the windows and every fold's dates), ``folds/fold_<k>.json`` (the
fold's validations, its chosen checkpoint and its test scores) and ``folds/fold_<k>.pt`` (the
chosen network's weights), then ``report.json``, ``report.md`` and ``equity.png``
(:mod:`gper.walkforward.report`).

Folds run one after another: a fold's network and replay are small (the ``market-walk`` preset),
so one fold does not fill a GPU, but folds of one run are cheap enough that running several
processes (series, seeds, replay kinds) side by side on the GPU uses it better than batching the
folds of one run together, and keeps each fold's run the same as it would be alone.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from gper.dqn.config import Config, as_run, cpu_threads, from_settings, pick_device, walk_spec
from gper.dqn.network import padded_width
from gper.dqn.walk_settings import WALK_FIELDS
from gper.envs.folds import Fold, WalkSpec, walk_forward_folds
from gper.envs.market import OBS_DIM
from gper.envs.market_data import Bars, synthetic_bars
from gper.envs.packaged import PREFIX, is_packaged, read_bars
from gper.training import parallel
from gper.training.extras import require
from gper.walkforward import report as wf_report
from gper.walkforward.baselines import BASELINES, LABELS
from gper.walkforward.fold import FoldRun, fold_config, run_fold
from gper.walkforward.outcome import FoldOutcome, Window
from gper.walkforward.report import fmt_sharpe
from gper.walkforward.scores import bars_per_year, pnl_scores

SYNTHETIC_BARS = 5031
"""Synthetic walk-forward series: as many weekday bars as the packaged daily series hold (1999-2018)."""
SYNTHETIC_SEED = 0
"""Seed of the synthetic walk-forward series: one series for every run seed, as a real series is."""


def load_series(config: Config) -> tuple[str, Bars]:
    """(name, bars) of the series ``config.data`` names: packaged bars, a CSV file, or synthetic ones."""
    if config.data is None:
        n = config.bars or SYNTHETIC_BARS
        return "synthetic", synthetic_bars(n, SYNTHETIC_SEED)
    name = str(config.data).removeprefix(PREFIX) if is_packaged(config.data) else Path(config.data).stem
    return name, read_bars(config.data)


@dataclasses.dataclass
class WalkForwardResult:
    """What :func:`walk_forward` returns."""

    folder: Path
    report: dict[str, Any]
    """the report (:func:`gper.walkforward.report.build_report`); empty without test scores"""
    folds: list[FoldRun]
    """every fold's run: settings, validations, chosen checkpoint"""
    outcomes: list[FoldOutcome]
    """every fold's test walk (none without test scores)"""


def _window(time_ns: torch.Tensor, start: int, end: int) -> Window:
    return Window.of(time_ns[start:end].numpy())


def walk_forward(config: Config, log: Callable[[str], None] = print, score_test: bool = True) -> WalkForwardResult:
    """Run the walk-forward folds ``config`` asks for (see the module docstring).

    With ``score_test`` False the folds stop after choosing their checkpoints: nothing reads the
    test windows (for choosing settings on validation scores alone); no report is written then.

    Raises:
        ValueError: bad settings or data, a fold too short, or no complete fold.
    """
    spec = _check_walk(config)
    tqdm = require("tqdm.auto", "the progress bar", "or progress=False").tqdm if config.progress else None
    device = pick_device(config.device)
    series, bars = load_series(config)
    folds = walk_forward_folds(bars.time_ns.numpy(), spec)
    cfgs = [fold_config(config, fold, device) for fold in folds]  # every fold's settings checked first
    threads = None
    if device.type == "cpu":  # as a plain run: one thread for a small network (cpu_threads), put back at the end
        threads = cpu_threads(cfgs[0], padded_width(OBS_DIM), cfgs[0].actions)
    stored = _resumed(config) if config.resume is not None else None
    if stored is not None:  # what the run resolved, where a default may have moved since it started
        before = stored.get("settings", {}).get("cost_bps")
        if before is not None and before != cfgs[0].cost_bps:
            raise ValueError(
                f"--resume {config.resume}: its folds ran at cost_bps {before}, the settings resolve to "
                f"{cfgs[0].cost_bps} now (a changed default): finish it with the gper that started it"
            )
    folder = Path(config.resume) if config.resume is not None else _folder(config, series)
    t = bars.time_ns
    meta = _meta(config, series, spec, device, threads, t, folds, cfgs)
    if stored is None:
        _write_json(folder / "config.json", meta)
    log(f"gper train: walk-forward on {series} ({len(bars.close)} bars): {len(folds)} folds of {spec.describe()}")
    log(f"gper train: writing to {folder}")
    bar = None
    if tqdm is not None:
        bar = tqdm(total=sum(c.total_steps for c in cfgs), unit="step", dynamic_ncols=True, desc="gper walk-forward")
    runs, outcomes = [], []
    t0 = time.perf_counter()
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        for fold, cfg in zip(folds, cfgs, strict=True):
            done = _done_fold(folder, fold, cfg, score_test)
            if done is not None:  # a resumed run: this fold finished before
                run, outcome = done
                if cfg.population > 1 and "members" not in run.chosen:
                    raise ValueError(
                        f"--resume {folder}: fold {fold.index} trained one agent (a gper before walk-forward "
                        f"ensembles ignored --population): start the run again for an ensemble of {cfg.population}"
                    )
                if bar is not None:
                    bar.update(cfg.total_steps)
            else:
                run = run_fold(
                    config, bars, fold, device, progress=None if bar is None else bar.update, score_test=score_test
                )
                outcome = _record_fold(folder, bars, fold, run)
            runs.append(run)
            if outcome is not None:
                outcomes.append(outcome)
            log(_fold_line(fold, len(folds), run, outcome) + (" (done before)" if done is not None else ""))
    except KeyboardInterrupt:
        log(f"gper train: stopped after {len(runs)} of {len(folds)} folds; continue with --resume {folder}")
        raise
    finally:
        torch.set_num_threads(before)
        if bar is not None:
            bar.close()
    report: dict[str, Any] = {}
    if score_test:
        meta["seconds"] = round(time.perf_counter() - t0, 1)
        report = _write_report(
            folder,
            meta,
            outcomes,
            t,
            folds,
            f"{series}: walk-forward out of sample, {spec.describe()} (seed {config.seed}, {meta['replay']})",
            log,
        )
    return WalkForwardResult(folder, report, runs, outcomes)


def _check_walk(config: Config) -> WalkSpec:
    """The windows of a walk-forward run, after the checks of what it cannot do."""
    spec = walk_spec(config)
    if spec is None:
        raise ValueError("walk-forward needs windows: --train-months, --val-months and --test-months (or days, bars)")
    if config.env != "market":
        raise ValueError(f"walk-forward folds are for the market environment, not {config.env}")
    if config.distributed not in ("auto", "off") or parallel.resolve_mode(config.distributed) != "off":
        raise ValueError("walk-forward runs on one process: --distributed off, without torchrun's several processes")
    if config.sampling == "rank":
        raise ValueError(
            "walk-forward folds do not re-sort ranks between steps: use --sampling proportional, stratified or uniform"
        )
    if config.sweep:
        raise ValueError(
            "a walk-forward fold's population is an ensemble of seeds of one setting: --sweep is for plain runs"
        )
    if config.population > 1 and ((config.n_step or 1) > 1 or config.replay == "trajectory"):
        raise ValueError("an ensemble (--population > 1) trains on the flat replay: n_step 1, --replay flat or auto")
    return spec


def _meta(
    config: Config,
    series: str,
    spec: WalkSpec,
    device: torch.device,
    threads: int | None,
    t: torch.Tensor,
    folds: list[Fold],
    cfgs: list[Config],
) -> dict[str, Any]:
    """What ``config.json`` says of the run: the series, windows, settings and every fold."""
    return {
        "series": series,
        "data": config.data,
        "windows": dataclasses.asdict(spec),
        "device": str(device),
        "seed": config.seed,
        "replay": "uniform" if config.sampling == "uniform" else f"prioritized ({config.sampling})",
        "settings": as_run(cfgs[0], device, threads) | {"total_steps": None, "seed": config.seed},
        "folds": [
            {
                "index": f.index,
                **{name: _window(t, w.start, w.end).to_dict() for name, w in _named(f)},
                "total_steps": c.total_steps,
            }
            for f, c in zip(folds, cfgs, strict=True)
        ],
        "config": _asked(config),
    }


def _write_report(
    folder: Path,
    meta: dict[str, Any],
    outcomes: list[FoldOutcome],
    t: torch.Tensor,
    folds: list[Fold],
    title: str,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """The run's report from the folds' outcomes, written to ``folder``; its summary line logged."""
    # every bar of the out-of-sample span counts, those between test windows too (a step
    # longer than the test window leaves gaps that are time, not bars)
    span = t[folds[0].test.start : folds[-1].test.end].numpy()
    # the report's own tables list the folds; config.json keeps them, and the settings as asked
    shown = {k: v for k, v in meta.items() if k not in ("folds", "config")}
    report = wf_report.build_report(outcomes, shown, per_year=bars_per_year(span))
    paths = wf_report.write_report(folder, report, outcomes, title)
    if paths.get("png") is None:
        log('gper train: no equity.png: the plot needs matplotlib: pip install ".[train]"')
    log(_summary_line(report))
    return report


#: settings a resumed walk-forward run may change: they do not change what a fold computes
RESUMABLE = ("resume", "progress", "tensorboard", "run_dir", "run_name", "device", "threads")


def _asked(config: Config) -> dict[str, Any]:
    """``config`` as asked (before presets), in JSON types: what a resume compares against."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(config).items()}


def _flat(asked: dict[str, Any]) -> dict[str, Any]:
    """``asked`` with its ``walk`` section's settings at the top level, named as their flags are."""
    return {k: v for k, v in asked.items() if k != "walk"} | asked["walk"]


def resume_config(path: str | Path) -> Config | None:
    """The settings a walk-forward run folder was started with (its ``config.json``), or None when
    ``path`` is not a walk-forward run folder (a plain run's checkpoint, say)."""
    stored = Path(path) / "config.json"
    if not stored.is_file():
        return None
    try:
        meta = json.loads(stored.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or "windows" not in meta or "config" not in meta:
        return None
    asked = dict(meta["config"])
    for name in ("hidden", "sweep"):  # tuples, which JSON wrote as lists
        if asked.get(name) is not None:
            asked[name] = tuple(asked[name])
    names = {f.name for f in dataclasses.fields(Config)} | set(WALK_FIELDS)  # flat: written before Config.walk
    return from_settings({k: v for k, v in asked.items() if k in names})


def _resumed(config: Config) -> dict[str, Any]:
    """The stored ``config.json`` of the run ``config.resume`` continues, checked against ``config``.

    Raises:
        ValueError: not a walk-forward run folder, or a setting that changes what a fold computes.
    """
    stored = resume_config(config.resume)
    if stored is None:
        raise ValueError(f"{config.resume} is not a walk-forward run folder (no config.json with windows)")
    before, now = _flat(_asked(stored)), _flat(_asked(config))
    for name, value in now.items():
        if name not in RESUMABLE and before.get(name) != value:
            raise ValueError(
                f"--resume {config.resume}: {name} was {before.get(name)!r}, now {value!r}; a resumed walk-forward "
                f"run keeps its settings (it may change only {', '.join(RESUMABLE[1:])})"
            )
    return json.loads((Path(config.resume) / "config.json").read_text())


def _done_fold(folder: Path, fold: Fold, cfg: Config, score_test: bool) -> tuple[FoldRun, FoldOutcome | None] | None:
    """A fold an earlier segment of the run finished (its record and, when tested, its test walk), or None."""
    name = folder / "folds" / f"fold_{fold.index:03d}"
    try:
        record = json.loads(name.with_suffix(".json").read_text())
    except (OSError, ValueError):
        return None
    if score_test and record.get("outcome") is None:
        return None
    outcome = FoldOutcome.from_dict(record["outcome"]) if record.get("outcome") is not None else None
    state = torch.load(name.with_suffix(".pt"), weights_only=True) if name.with_suffix(".pt").exists() else None
    test = None
    if outcome is not None:
        names = ("time_ns", "policy_pnl", "policy_traded", "hold_pnl", "hold_traded", "baselines")
        test = {k: getattr(outcome, k) for k in names}
        if outcome.members is not None:
            test["members"] = outcome.members
    run = FoldRun(cfg, record["chosen"], record["validations"], state, test, record["sigma"])
    return run, (outcome if score_test else None)


def _named(fold: Fold):
    return (("train", fold.train), ("val", fold.val), ("test", fold.test))


def _folder(config: Config, series: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    folder = Path(config.run_dir) / (config.run_name or f"market-walk__{series}__s{config.seed}__{stamp}")
    if (folder / "config.json").exists():
        raise ValueError(f"{folder} already holds a run: pick another --run-name")
    (folder / "folds").mkdir(parents=True, exist_ok=True)
    return folder


def _write_json(path: Path, data: Any) -> None:
    from gper._files import atomic_file

    with atomic_file(path) as f:
        f.write((json.dumps(data, indent=2, allow_nan=False) + "\n").encode())


def _record_fold(folder: Path, bars: Bars, fold: Fold, run: FoldRun) -> FoldOutcome | None:
    """``folds/fold_<k>.json`` and ``.pt``; the fold's :class:`~gper.walkforward.report.FoldOutcome` when tested."""
    name = folder / "folds" / f"fold_{fold.index:03d}"
    if run.state is not None:
        torch.save(run.state, name.with_suffix(".pt"))
    t = bars.time_ns
    record: dict[str, Any] = {
        "index": fold.index,
        **{k: _window(t, w.start, w.end).to_dict() for k, w in _named(fold)},
        "total_steps": run.cfg.total_steps,
        "seed": run.cfg.seed,
        "sigma": run.sigma,
        "chosen": run.chosen,
        "validations": run.validations,
    }
    outcome = None
    if run.test is not None:
        outcome = FoldOutcome(
            index=fold.index,
            train=_window(t, fold.train.start, fold.train.end),
            val=_window(t, fold.val.start, fold.val.end),
            test=_window(t, fold.test.start, fold.test.end),
            chosen=run.chosen,
            **run.test,
        )
        record["outcome"] = outcome.to_dict()
        record["test"] = {
            "policy": pnl_scores(run.test["policy_pnl"], run.test["policy_traded"]),
            "buy_and_hold": pnl_scores(run.test["hold_pnl"], run.test["hold_traded"]),
            **{name: pnl_scores(pnl, traded) for name, (pnl, traded) in outcome.baselines.items()},
        }
    _write_json(name.with_suffix(".json"), record)
    return outcome


def _fold_line(fold: Fold, n: int, run: FoldRun, outcome) -> str:
    c = run.chosen
    pick = f"checkpoint {c.get('epoch')}"
    if c["flat"]:  # why: the rules of gper.walkforward.fold, in their order
        if "score" not in c:
            why = "no checkpoint was validated"
        elif run.cfg.walk.flat_fallback and c["score"] <= 0:
            why = "no checkpoint beat flat on validation"
        else:
            why = f"its deflated Sharpe ratio is below {run.cfg.walk.min_deflated_sharpe}"
        pick = f"flat ({why})"
    if c.get("members"):
        pick = f"ensemble of {c['members']} members, {pick}"
    # numbered as folds/fold_<k>.json and the report's tables number it, from 0
    line = f"fold {fold.index} (of 0..{n - 1}): {pick}, validation {c.get('metric')} "
    line += f"{c.get('score', float('nan')):+.4f}"
    if "deflated_sharpe" in c:  # the selection's worth once its candidates are counted
        line += f", deflated Sharpe {c['deflated_sharpe']:.2f} of {c['trials']} candidates"
    if outcome is not None:
        line += (
            f"; test {outcome.test.start}..{outcome.test.end}: log P&L {outcome.policy_pnl.sum():+.4f} "
            f"(buy-and-hold {outcome.hold_pnl.sum():+.4f}, flat +0.0000"
            + "".join(f", {LABELS[name]} {pnl.sum():+.4f}" for name, (pnl, _) in outcome.baselines.items())
            + ")"
        )
        if outcome.members is not None:
            alone = outcome.members[0].sum(axis=1)
            line += f"; members alone {alone.mean():+.4f} on average ({alone.min():+.4f} .. {alone.max():+.4f})"
    return f"gper train: {line}"


def _summary_line(report: dict[str, Any]) -> str:
    oos = report["out_of_sample"]
    return (
        f"gper train: out of sample {oos['start']}..{oos['end']} ({oos['bars']} bars): log P&L "
        f"{oos['policy']['log_pnl']:+.4f} (Sharpe/yr {oos['policy']['sharpe_annual']:+.2f}, max drawdown "
        f"{oos['policy']['max_drawdown']:.4f}); buy-and-hold {oos['buy_and_hold']['log_pnl']:+.4f}; flat +0.0000"
        + "".join(
            f"; {LABELS[name]} {oos[name]['log_pnl']:+.4f} (Sharpe/yr {fmt_sharpe(oos[name]['sharpe_annual'])})"
            for name in BASELINES
            if name in oos
        )
    )


__all__ = ["SYNTHETIC_BARS", "WalkForwardResult", "load_series", "resume_config", "walk_forward"]
