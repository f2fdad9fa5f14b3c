"""aistack's public package: what a user's code imports.

- For a training loop of the user's (``task.entrypoint``): ``TrialContext``,
  the data it carries (``Dataset``), its checkpoints (``Checkpoint``) and the
  signals that end a trial (``TrialPruned``, ``TrialStopped``);
  ``aistack.local.run`` runs such a loop in this process.
- For a model of the user's (``task.model``): the builder gets the trial's
  parameters and its ``Dataset``.
- For scripts and notebooks: ``Client`` (studies, models, predictions,
  lineage), what the ``aistack`` command does.

Nothing else of the platform is public.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aistack.trial import (
    CLASSIFICATION,
    REGRESSION,
    Checkpoint,
    Dataset,
    ExportFailed,
    InvalidReport,
    StopTrial,
    TrialContext,
    TrialPruned,
    TrialStopped,
)

if TYPE_CHECKING:
    from aistack.client import Client

__all__ = [
    "CLASSIFICATION",
    "REGRESSION",
    "Checkpoint",
    "Client",
    "Dataset",
    "ExportFailed",
    "InvalidReport",
    "StopTrial",
    "TrialContext",
    "TrialPruned",
    "TrialStopped",
]


def __getattr__(name: str) -> Any:
    # The client pulls in gRPC and the contracts: only for those who use it.
    if name == "Client":
        from aistack.client import Client

        return Client
    raise AttributeError(f"module 'aistack' has no attribute {name!r}")
