"""Budgeted KV-cache repair after context edits (paper 2).

``repair(model, cache, Edit(p0, p1), query, budget, allocator, executor)`` is the entry point;
the edit operators (Dirty, Shift, Replay, Re-prefill) live in :mod:`.edit`, budgets in
:mod:`.budget`, executors in :mod:`.executors`, allocators in :mod:`.allocators`.
"""

from nexus_mlx.refresh.budget import budget_tokens, intervals
from nexus_mlx.refresh.budgeted import RepairResult, repair
from nexus_mlx.refresh.edit import Edit, dirty, replay, reprefill, shift
from nexus_mlx.refresh.executors import refresh, refresh_packed, refresh_sequential

__all__ = [
    "Edit",
    "RepairResult",
    "budget_tokens",
    "dirty",
    "intervals",
    "refresh",
    "refresh_packed",
    "refresh_sequential",
    "repair",
    "replay",
    "reprefill",
    "shift",
]
