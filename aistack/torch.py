"""The trial context of a PyTorch training loop, and how its model is
exported for the model server.

``TorchContext`` adds the placement helpers: ``prepare_model`` moves the
model to the rank's device and wraps it in DistributedDataParallel when the
trial has several ranks; ``prepare_data_loader`` shards a DataLoader over the
ranks (a DistributedSampler, re-seeded every epoch) and moves its batches to
the device, as Ray Train's functions of the same names do.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, TensorDataset

from aistack.trial import (
    CLASSIFICATION,
    FRAMEWORK_TORCH,
    Exported,
    ExportFailed,
    ExportRequest,
    TensorDescription,
    TrialContext,
)
from shared.artifacts import TORCH_EXPORT_FILE

#: The Open Inference Protocol datatype of each torch dtype a model may take or give.
DATATYPES = {
    torch.float32: "FP32",
    torch.float64: "FP64",
    torch.float16: "FP16",
    torch.int64: "INT64",
    torch.int32: "INT32",
    torch.int16: "INT16",
    torch.int8: "INT8",
    torch.uint8: "UINT8",
    torch.bool: "BOOL",
}
EXPORT_FORMAT = "torch_export"


class TorchContext(TrialContext):
    """The context of a PyTorch trial: ``device`` is this rank's, and
    ``process_group`` the trial's (None for one process)."""

    framework = FRAMEWORK_TORCH

    def __init__(self, *, device: torch.device, process_group: Any = None, **common: Any) -> None:
        super().__init__(**common)
        self._device = device
        self.process_group = process_group

    @property
    def device(self) -> torch.device:
        return self._device

    def prepare_model(self, model: Any) -> Any:
        if not isinstance(model, nn.Module):
            raise TypeError(f"prepare_model takes a torch.nn.Module, not {type(model).__name__}")
        model = model.to(self._device)
        if self.world_size > 1:
            cuda = self._device.type == "cuda"
            return DistributedDataParallel(model, device_ids=[self._device.index] if cuda else None)
        return model

    def prepare_data_loader(self, loader: Any) -> Any:
        if not isinstance(loader, DataLoader):
            raise TypeError(
                f"prepare_data_loader takes a torch DataLoader, not {type(loader).__name__}"
            )
        sampler: DistributedSampler[Any] | None = None
        if self.world_size > 1:
            sampler = DistributedSampler(
                loader.dataset,
                num_replicas=self.world_size,
                rank=self.rank,
                shuffle=isinstance(loader.sampler, RandomSampler),
                seed=self.seed,
            )
            loader = DataLoader(
                loader.dataset,
                batch_size=loader.batch_size,
                sampler=sampler,
                num_workers=loader.num_workers,
                collate_fn=loader.collate_fn,
                pin_memory=loader.pin_memory,
                drop_last=loader.drop_last,
            )
        return _OnDevice(loader, self._device, sampler)

    def data_loader(
        self, split: str = "train", *, batch_size: int = 32, shuffle: Any = None
    ) -> Any:
        x, y = self.data.split(split)
        targets = torch.as_tensor(y)
        if self.data.task != CLASSIFICATION:
            targets = targets.float().reshape(-1, 1)
        generator = torch.Generator().manual_seed(self.seed)
        loader = DataLoader(
            TensorDataset(torch.as_tensor(x), targets),
            batch_size=batch_size,
            shuffle=(split == "train") if shuffle is None else bool(shuffle),
            generator=generator,
        )
        return self.prepare_data_loader(loader)


class _OnDevice:
    """A prepared loader: each pass sets its sampler's epoch (a new shuffle per
    pass, the same on every rank) and yields batches on the device."""

    def __init__(
        self, loader: DataLoader[Any], device: torch.device, sampler: DistributedSampler[Any] | None
    ) -> None:
        self.loader = loader
        self._device = device
        self._sampler = sampler
        self._epoch = 0

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        if self._sampler is not None:
            self._sampler.set_epoch(self._epoch)
        self._epoch += 1
        for batch in self.loader:
            yield _to(batch, self._device)


def _to(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        return {key: _to(value, device) for key, value in batch.items()}
    if isinstance(batch, list | tuple):
        return type(batch)(_to(value, device) for value in batch)
    return batch


def export(request: ExportRequest, export_dir: Path) -> Exported:
    """``torch.export`` the model of ``request`` on the CPU, with a dynamic
    batch dimension, into ``export_dir`` (no pickle: the program and its
    weights load with ``torch.export.load``). Raises ExportFailed."""
    model = request.model
    if isinstance(model, DistributedDataParallel):
        model = model.module
    if not isinstance(model, nn.Module):
        raise ExportFailed(f"export takes a torch.nn.Module, not {type(model).__name__}")
    served = copy.deepcopy(model).cpu().eval()
    example = _example(request.example)
    with torch.no_grad():
        out = served(example)
    outputs = _outputs(out, request.output_names)
    batch = torch.export.Dim("batch", min=1, max=1 << 20)
    try:
        program = torch.export.export(served, (example,), dynamic_shapes=({0: batch},))
    except Exception as exc:  # whatever the tracer refuses
        raise ExportFailed(
            f"torch.export cannot trace the model: {type(exc).__name__}: {str(exc)[:500]}"
        ) from exc
    export_dir.mkdir(parents=True, exist_ok=True)
    torch.export.save(program, str(export_dir / TORCH_EXPORT_FILE))
    inputs = (("input", _datatype(example.dtype), (-1, *example.shape[1:])),)
    return Exported(EXPORT_FORMAT, inputs, outputs)


def _example(example: Any) -> torch.Tensor:
    tensor = (
        example.detach().cpu()
        if isinstance(example, torch.Tensor)
        else torch.as_tensor(np.asarray(example))
    )
    if tensor.ndim == 0:
        raise ExportFailed("export's example must be a batch (its first dimension the batch)")
    if len(tensor) == 1:
        # A batch of one would pin the batch dimension to 1 in the program.
        tensor = torch.cat([tensor, tensor])
    return tensor


def _outputs(out: Any, names: tuple[str, ...]) -> tuple[TensorDescription, ...]:
    if isinstance(out, Mapping):
        pairs = [(str(k), v) for k, v in out.items()]
    elif isinstance(out, list | tuple):
        given = names or tuple(f"output_{i}" for i in range(len(out)))
        if len(given) != len(out):
            raise ExportFailed(f"the model gives {len(out)} outputs, output_names has {len(given)}")
        pairs = list(zip(given, out, strict=True))
    else:
        pairs = [(names[0] if names else "output", out)]
    described = []
    for name, value in pairs:
        if not isinstance(value, torch.Tensor) or value.ndim == 0:
            raise ExportFailed(f"output {name!r} is not a batch of tensors")
        described.append((name, _datatype(value.dtype), (-1, *value.shape[1:])))
    return tuple(described)


def _datatype(dtype: torch.dtype) -> str:
    if dtype not in DATATYPES:
        raise ExportFailed(f"dtype {dtype} has no Open Inference Protocol datatype")
    return DATATYPES[dtype]
