"""Adapters that bring any stlsgd plan to where practitioners already train, each a thin layer over
:class:`stlsgd.dropin.PlanAverager` (or, for Flower, over the plan itself):

- :mod:`stlsgd.integrations.accelerate` -- :class:`~stlsgd.integrations.accelerate.StlsgdLocalSGD`, the shape of
  ``accelerate.local_sgd.LocalSGD`` with any plan (``pip install 'stlsgd[accelerate]'``);
- :mod:`stlsgd.integrations.lightning` -- :class:`~stlsgd.integrations.lightning.StlsgdCallback` for a
  ``Trainer(strategy="ddp")`` (``pip install 'stlsgd[lightning]'``);
- :mod:`stlsgd.integrations.flower` -- :class:`~stlsgd.integrations.flower.StlsgdFedAvg`, a server strategy that
  sends each round's local steps, learning rate and proximal term, and the client side
  (:func:`~stlsgd.integrations.flower.run_local_steps`, :class:`~stlsgd.integrations.flower.StlsgdClient`)
  (``pip install 'stlsgd[flower]'``);
- :mod:`stlsgd.integrations.tensorboard` -- per-round scalars for the drop-in's ``on_round`` and the simulator's
  metrics lines (``pip install 'stlsgd[tensorboard]'``).

Nothing here is imported by ``import stlsgd``: each module imports its framework when it is itself imported, and
says which extra to install when the framework is missing.
"""

from __future__ import annotations

from stlsgd.errors import StlsgdError


def missing(framework: str, extra: str, exc: ImportError) -> StlsgdError:
    """The one-line error of an adapter whose framework is not installed."""
    return StlsgdError(
        f"stlsgd.integrations.{extra}: needs {framework} ({exc}); install it with pip install 'stlsgd[{extra}]'"
    )


__all__ = ["missing"]
