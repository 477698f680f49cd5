"""Host-side checks of what callers pass to a buffer: from shapes, dtypes and devices only, so
no check reads a device value (except where ``strict`` or the CPU make that free)."""

from __future__ import annotations

import warnings

import torch

from gper.ops.state import P_MAX


class GperWarning(UserWarning):
    """Warnings from gper: CPU fallback, dropped invalid input found on the device."""


def warn_cpu_fallback(device: torch.device, capacity: int, nbytes: int) -> None:
    msg = (
        f"gper: not enough memory on {device} for a buffer of {capacity} slots ({nbytes / 2**30:.2f} GiB); "
        "falling back to the CPU (torch back end). Pass cpu_fallback=False to raise instead."
    )
    warnings.warn(msg, GperWarning, stacklevel=3)


_TRITON_WARNED: set[torch.device] = set()


def warn_triton_fallback(device: torch.device, problem: str) -> None:
    """Warn, once per device and process, that the Triton kernels do not work there."""
    if device in _TRITON_WARNED:
        return
    _TRITON_WARNED.add(device)
    msg = (
        f"gper: the Triton back end does not work on {device} ({problem}); buffers there use the torch "
        "back end on the same device (the same samples, slower). Pass backend='triton' to raise instead."
    )
    warnings.warn(msg, GperWarning, stacklevel=4)


def warn_no_graph_memory() -> None:
    msg = (
        "gper: out of GPU memory capturing a CUDA graph of a new call shape (a new batch size, say); "
        "calls of that shape run without a graph (slower on the host) until memory allows one"
    )
    warnings.warn(msg, GperWarning, stacklevel=5)


def out_of_memory(err: torch.OutOfMemoryError, device: torch.device, what: str) -> torch.OutOfMemoryError:
    """A clear out-of-memory error for a buffer call, to raise ``from err``."""
    first = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return torch.OutOfMemoryError(
        f"gper: out of memory on {device} {what}. Free device memory (or use smaller batches) and call again. ({first})"
    )


def warn_dropped(invalid: int, reported: int) -> int:
    """Warn about update entries dropped for bad indices since the last report; the new count reported."""
    if invalid > reported:
        msg = f"gper: {invalid - reported} update entries had indices outside [0, size) and were dropped"
        warnings.warn(msg + " (pass strict=True to raise)", GperWarning, stacklevel=3)
    return invalid


def check_unit(name: str, value: object, low_open: bool = False) -> float:
    """``value`` as a float in [0, 1] (``(0, 1]`` with ``low_open``), or a TypeError/ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    value = float(value)
    ok = (0.0 < value if low_open else 0.0 <= value) and value <= 1.0
    if not ok:
        raise ValueError(f"{name} must be in {'(0, 1]' if low_open else '[0, 1]'}, got {value}")
    return value


def check_batch_size(batch_size: object) -> int:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int):
        raise TypeError(f"batch_size must be an int, got {type(batch_size).__name__}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return batch_size


def check_beta_tensor(beta: torch.Tensor, device: torch.device, name: str = "beta") -> None:
    """A 0-d float tensor on ``device``; on the CPU (where reading it is free) also in [0, 1]. On
    a GPU the kernels clamp it to [0, 1] instead: checking it there would cost a host sync."""
    if beta.dim() != 0 or not beta.dtype.is_floating_point or beta.device != device:
        raise ValueError(
            f"{name} tensor must be a 0-d float tensor on {device}, got shape {tuple(beta.shape)} "
            f"{beta.dtype} on {beta.device}"
        )
    if device.type == "cpu" and not 0.0 <= float(beta) <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got a tensor holding {float(beta)}")


def check_indices(indices: object, device: torch.device, size: int, strict: bool, what: str) -> torch.Tensor:
    """``indices`` as int64 after checking type, shape and device; on the CPU (or with ``strict``)
    also the range ``[0, size)``, which costs a host read of the indices."""
    if not isinstance(indices, torch.Tensor):
        raise TypeError(f"{what}: indices must be a torch.Tensor, got {type(indices).__name__}")
    if indices.dim() != 1:
        raise ValueError(f"{what}: indices must be 1-D [B], got shape {tuple(indices.shape)}")
    if indices.numel() == 0:
        raise ValueError(f"{what}: empty batch of indices")
    if indices.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{what}: indices must be int64 or int32, got {indices.dtype}")
    if indices.device != device:
        raise ValueError(f"{what}: indices are on {indices.device}, expected {device}")
    if device.type == "cpu" or strict:
        # on the CPU through NumPy, whose min and max of a few hundred indices cost a fraction of torch's
        view = indices.numpy() if device.type == "cpu" else indices
        lo, hi = int(view.min()), int(view.max())
        if lo < 0 or hi >= size:
            bad = lo if lo < 0 else hi
            raise IndexError(f"{what}: index {bad} out of range [0, {size}) (filled slots)")
    return indices if indices.dtype == torch.int64 else indices.long()


def check_generations(generations: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """A batch's generations, which must match its indices."""
    if generations.shape != indices.shape or generations.device != indices.device:
        raise ValueError("update_priorities(): the batch's generations do not match its indices")
    return generations


def check_td(td_errors: object, indices: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``td_errors`` [B] as detached float32, after checking it matches ``indices``."""
    what = "update_priorities()"
    if not isinstance(td_errors, torch.Tensor):
        raise TypeError(f"{what}: td_errors must be a torch.Tensor, got {type(td_errors).__name__}")
    if not td_errors.dtype.is_floating_point:
        raise TypeError(f"{what}: td_errors must be floating point, got {td_errors.dtype}")
    if td_errors.shape != indices.shape:
        raise ValueError(
            f"{what}: td_errors has shape {tuple(td_errors.shape)}, expected ({indices.numel()},) to match the indices"
        )
    if td_errors.device != device:
        raise ValueError(f"{what}: td_errors are on {td_errors.device}, expected {device}")
    td = td_errors.detach() if td_errors.requires_grad else td_errors
    if td.dtype == torch.float32:  # the common case: no op (each costs host time on an eager call)
        return td
    if td.dtype == torch.float64:  # finite values past float32's range stay finite: P_MAX after the clamp
        td = torch.where(torch.isfinite(td), td.clamp(-P_MAX, P_MAX), td)
    return td.float()
