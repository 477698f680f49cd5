"""The package's layers (``docs/design.md``, *Layers*): every import of a gper module, at the top
of a file or inside a function, goes to the same package or to a lower layer.

Parsed from the source with :mod:`ast`, so nothing is imported and a lazy import counts too.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

#: (layer, package or module) from the bottom up; a module belongs to the longest prefix listed
LAYERS: list[tuple[int, str]] = [
    (0, "gper._triton"),  # the one Triton import
    (0, "gper._device"),
    (0, "gper._files"),  # atomic files: the order of fsyncs and renames
    (1, "gper.ops"),  # kernels
    (2, "gper.replay"),  # the library
    (3, "gper"),  # the public face: gper/__init__.py re-exports the library
    (4, "gper.envs"),
    (4, "gper.distributed"),  # the buffer sharded over a process group: below the trainer that uses it
    (5, "gper.training"),  # the trainer core: no algorithm; builds environments from the registry
    (5, "gper.integrations"),  # adapters to other RL libraries' replay APIs
    (6, "gper.dqn"),  # the application: DQN, one algorithm on the trainer core
    (7, "gper.bench"),  # measurement: nothing in the package imports it
    (7, "gper.walkforward"),  # walk-forward evaluation over calendar folds: trains with gper.dqn, scores, reports
    (8, "gper.commands"),  # the trainer's command line: a plain run (gper.dqn) or walk-forward folds
    (9, "gper.cli"),  # the gper command: subcommands by name
    (10, "gper.__main__"),
]


def _unit(module: str) -> tuple[int, str]:
    """The (layer, unit) a dotted module name belongs to."""
    best = max((name for _, name in LAYERS if module == name or module.startswith(name + ".")), key=len, default=None)
    if best is None:
        raise AssertionError(f"{module} belongs to no layer: add it to LAYERS and to docs/design.md")
    return dict((n, lay) for lay, n in LAYERS)[best], best


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted((SRC / "gper").rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imports(module: str, path: Path) -> list[tuple[int, str]]:
    """(line, imported gper module) for every import in ``path``, relative ones resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from gper.ops import reference` imports the module gper.ops.tree.reference
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
            found.append((node.lineno, base))
    return [(line, name) for line, name in found if name == "gper" or name.startswith("gper.")]


def _resolve(name: str, modules: dict[str, Path]) -> str:
    # `from gper.ops.state import C_RNG` names an attribute: walk up to the module that exists
    while name not in modules and "." in name:
        name = name.rpartition(".")[0]
    return name


def test_every_module_has_a_layer():
    for module in _modules():
        _unit(module)


def test_imports_only_go_down_the_layers():
    modules = _modules()
    bad = []
    for module, path in modules.items():
        layer, unit = _unit(module)
        for line, name in _imports(module, path):
            target = _resolve(name, modules)
            t_layer, t_unit = _unit(target)
            if t_unit == unit:
                continue
            # a package of the same layer (envs and distributed) is not below: keep them independent
            if t_layer >= layer:
                bad.append(
                    f"{path.relative_to(SRC)}:{line}: {module} (layer {layer}) imports {target} (layer {t_layer})"
                )
    assert not bad, "imports that run up (or across) a layer:\n" + "\n".join(dict.fromkeys(bad))


#: the buffer's private attributes: nothing outside gper/replay/ may read them
#: (today's, and those of earlier versions that scripts used to read)
PRIVATE = re.compile(
    r"(?<!self)\.(_cfg|_graphs|_flat|_beta|_size|_row_layout|_invalid_reported|_tensors|_sample_slots"
    r"|_tree|_mintree|_tree_layout|_rows_layout|_gen|_owner|_counters|_scalars|_key|_ops)\b"
)


def test_nothing_reaches_for_scripts_or_into_the_buffer():
    root = SRC.parent
    files = [p for p in (SRC / "gper").rglob("*.py") if "replay" not in p.parts]
    files += sorted((root / "benchmarks").glob("*.py"))
    files += sorted(p for p in (root / "tests").rglob("*.py") if p.name != "test_layers.py")
    bad = []
    for path in files:
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            code = line.split("#", 1)[0]
            if "sys.path" in code or re.search(r"\b(import|from) benchmarks\b", code) or PRIVATE.search(code):
                bad.append(f"{path.relative_to(root)}:{i}: {line.strip()}")
    assert not bad, "\n".join(bad)


def test_every_capture_in_the_package_goes_through_the_gc_safe_one():
    """``torch.cuda.graph`` directly only in ``gper/replay/graphs.py`` (``capture`` wraps it)."""
    bad = []
    for path in sorted((SRC / "gper").rglob("*.py")):
        if path.relative_to(SRC).as_posix() == "gper/replay/graphs.py":
            continue
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if "torch.cuda.graph(" in line.split("#", 1)[0]:
                bad.append(f"{path.relative_to(SRC)}:{i}: {line.strip()}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(
    "module, target, ok",
    [
        ("gper.replay.buffer", "gper.ops.tree.reference", True),
        ("gper.ops.tree.reference", "gper.replay.tree", False),
        ("gper.training.phases", "gper.dqn", False),
        ("gper.envs.cartpole", "gper.training.timing", False),
        ("gper.dqn.build", "gper.training.phases", True),
        ("gper.dqn.build", "gper.bench", False),
        ("gper.training.trainer", "gper.envs.registry", True),
        ("gper.training.trainer", "gper.dqn", False),
        # hindsight relabelling is the replay layer's: the kernels' Philox below it, no environment
        ("gper.replay.her", "gper.ops.philox", True),
        ("gper.replay.episodes", "gper.replay.trajectory", True),
        ("gper.replay.her", "gper.envs", False),
    ],
)
def test_the_rule_itself(module, target, ok):
    (layer, unit), (t_layer, t_unit) = _unit(module), _unit(target)
    assert (t_unit == unit or t_layer < layer) == ok


def test_import_gper_loads_only_the_buffer_and_its_layers_below():
    """``gper.dqn`` and the other upper packages are attributes of ``gper`` resolved on first use
    (``gper.__getattr__``), not imports: ``import gper`` must not load them."""
    code = (
        "import sys, gper; upper = ('gper.dqn', 'gper.envs', 'gper.training', 'gper.integrations',"
        " 'gper.distributed', 'gper.bench', 'gper.walkforward');"
        "print(sorted(m for m in sys.modules if m.startswith(upper)));"
        "gper.dqn.train; print('gper.dqn' in sys.modules, hasattr(gper, 'bench') and 'gper.bench' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[:2] == ["[]", "True False"], out
