"""A rank dies with its launcher: no rank outlives a killed ``torchrun``.

``torchrun`` stops its worker processes when it is stopped (SIGTERM, Ctrl-C), but ``kill -9``
of it (or the OOM killer) runs no cleanup: its workers, reparented, go on training to the end
of the run, writing checkpoints beside the job that resumes from them. Under ``torchrun``
(``TORCHELASTIC_RUN_ID`` in the environment, the launcher being this process's parent)
:func:`die_with_launcher` makes this rank end when its launcher ends
(:func:`slimdata.orphans.die_with_parent`: the kernel's parent-death signal on Linux, a
polling thread elsewhere). Both loaders call it when they are built and :func:`run_step` at
every step, so a loop that uses either needs nothing of its own. A process not started by
``torchrun`` is left alone (a plain ``python train.py`` must survive its shell).
"""

from __future__ import annotations

import os

from slimdata.orphans import die_with_parent

__all__ = ["die_with_launcher"]

_RUN_ID = "TORCHELASTIC_RUN_ID"
"""Set by torchrun (torch.distributed.elastic) in every worker's environment."""

_armed_for: int | None = None
"""The launcher pid this process already dies with (the request is made once per process)."""


def die_with_launcher() -> bool:
    """End this process when its ``torchrun`` launcher ends; False (nothing done) when this
    process was not started by ``torchrun``."""
    global _armed_for
    if _RUN_ID not in os.environ:
        return False
    launcher = os.getppid()
    if _armed_for != launcher:
        die_with_parent(launcher)
        _armed_for = launcher
    return True
