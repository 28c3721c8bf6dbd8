"""The model as flat buffers: every floating parameter and buffer of a module moved, once, into one contiguous
buffer per (dtype, device), the module's tensors re-pointed at slices of it. An average then reduces a handful
of flat buffers in place and copies nothing."""

from __future__ import annotations

import torch
from torch import nn

from stlsgd.errors import StlsgdError

Slot = tuple[nn.Module | None, str | None, torch.Tensor]


class FlatModel:
    """``module``'s floating parameters (in ``parameters()`` order) and floating buffers (BatchNorm statistics),
    as views of :attr:`flats` (one per dtype and device).

    :attr:`params` lists the parameters (their identities stay: the optimizer's state still refers to them).
    :meth:`check` re-flattens when something replaced a tensor's storage (``model.to()``, a
    ``load_state_dict(assign=True)``), and refuses a parameter or buffer added or removed since: the
    averager's per-parameter state (anchor, control variates, outer momentum) would no longer line up.
    """

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.params: list[torch.Tensor] = []
        self.flats: list[torch.Tensor] = []
        self._expected: list[tuple[nn.Module | None, str | None, torch.Tensor, int]] = []
        self._members: tuple[int, ...] = ()
        self.flatten()

    def _slots(self) -> list[Slot]:
        slots: list[Slot] = [(None, None, p) for p in self.module.parameters() if torch.is_floating_point(p)]
        for module in self.module.modules():
            for name, buf in module._buffers.items():
                if buf is not None and torch.is_floating_point(buf):
                    slots.append((module, name, buf))
        return slots

    def _identity(self, slots: list[Slot]) -> tuple[int, ...]:
        return tuple(id(t) if module is None else hash((id(module), name)) for module, name, t in slots)

    def flatten(self) -> None:
        """Move every floating parameter and buffer into the flat buffers, as views."""
        slots = self._slots()
        self.params = [t for module, _, t in slots if module is None]
        self._members = self._identity(slots)
        groups: dict[tuple[torch.dtype, torch.device], list[Slot]] = {}
        for slot in slots:
            groups.setdefault((slot[2].dtype, slot[2].device), []).append(slot)
        self.flats = []
        self._expected = []
        for (dtype, device), members in groups.items():
            sizes = [t.numel() for _, _, t in members]
            flat = torch.empty(sum(sizes), dtype=dtype, device=device)
            with torch.no_grad():
                for (module, name, tensor), piece in zip(members, flat.split(sizes)):
                    view = piece.view_as(tensor)
                    view.copy_(tensor)
                    if module is None:
                        tensor.data = view  # the Parameter object stays; only its storage moves
                    else:
                        module._buffers[name] = view  # type: ignore[index]
                    self._expected.append((module, name, tensor, view.data_ptr()))
            self.flats.append(flat)

    def intact(self) -> bool:
        """Whether every tensor still lives in its slice of the flat buffers."""
        for module, name, tensor, ptr in self._expected:
            current = tensor if module is None else module._buffers.get(name)  # type: ignore[arg-type]
            if current is None or current.data_ptr() != ptr:
                return False
        return True

    def check(self) -> None:
        """Refuse a changed set of tensors (one line); re-flatten moved ones."""
        if self._identity(self._slots()) != self._members:
            raise StlsgdError(
                "model: its parameters or buffers changed (one added, removed or replaced) after the PlanAverager was "
                "built, so the averages would miss them: build the averager once the model is complete"
            )
        if not self.intact():
            self.flatten()

    @property
    def nbytes_params(self) -> int:
        """Bytes of the parameters (what a per-step DDP all-reduces as gradients)."""
        return sum(p.numel() * p.element_size() for p in self.params)
