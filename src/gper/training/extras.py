"""The trainer's third-party packages (tyro, tqdm, matplotlib) come with the ``train`` extra,
tensorboard with the ``tensorboard`` extra; each is imported where it is used, and a missing one
gives one line that names the extra (the same for every algorithm on the trainer core)."""

from __future__ import annotations

import importlib
from types import ModuleType


def install(extra: str) -> str:
    """The command that installs gper's optional dependencies ``extra``."""
    return f'pip install ".[{extra}]"'


INSTALL = install("train")


class MissingExtra(ImportError):
    """A package of the ``train`` extra is not installed; the message says how to install it."""


def require(module: str, needed_by: str = "gper train", otherwise: str = "") -> ModuleType:
    """``import module``, or :class:`MissingExtra`: ``"<needed_by> needs <package>: pip install ..."``
    (then ``otherwise``, another way out, when given)."""
    package = module.partition(".")[0]
    try:
        importlib.import_module(package)  # first: a submodule imported before is found without it
        return importlib.import_module(module)
    except ImportError as err:
        message = f"{needed_by} needs {package}: {INSTALL}" + (f", {otherwise}" if otherwise else "")
        raise MissingExtra(message) from err
