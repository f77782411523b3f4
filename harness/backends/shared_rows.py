"""Logits rows that may be one row shared by every request: a stride-0 view.

``harness.sampling.device.trials`` passes such a view to backends with ``shared_rows = True``. An
adapter that transforms the rows (casts them, divides them by the temperature) must do it
on the one row and expand the result, or it materializes every trial's copy, which is
exactly what sharing avoids (at V = 152,064 and 10^5 trials per call, terabytes).
"""

import torch


def is_shared(rows: torch.Tensor) -> bool:
    """One row viewed ``rows.shape[0]`` times."""
    return rows.dim() == 2 and rows.shape[0] > 1 and rows.stride(0) == 0


def cast(rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``rows.to(dtype)``, still a view when shared (``.to`` would copy every row)."""
    if rows.dtype == dtype:
        return rows
    if is_shared(rows):
        return rows[:1].to(dtype).expand(rows.shape)
    return rows.to(dtype)


def divided(rows: torch.Tensor, divisor: torch.Tensor) -> torch.Tensor:
    """fp32 ``rows / divisor[:, None]``; still a view when shared and every divisor is equal."""
    if is_shared(rows) and bool((divisor == divisor[0]).all()):
        return (rows[:1].to(torch.float32) / divisor[:1, None]).expand(rows.shape)
    return rows.to(torch.float32) / divisor[:, None]
