"""The ``augment`` hyperparameter: while training, a share of the images is
moved by up to one pixel each way; never at serving time. The same in
PyTorch and Keras."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from svc_trainer.plan import Hyperparams
from tests.integration.trainer_support import digits_splits


def _shifts_of(image: np.ndarray) -> list[np.ndarray]:
    padded = np.pad(image, 1)
    h, w = image.shape
    return [padded[dy : dy + h, dx : dx + w] for dy in range(3) for dx in range(3)]


def _moved(images: np.ndarray, out: np.ndarray) -> int:
    """How many images came out moved; each must be one of its nine shifts."""
    moved = 0
    for image, result in zip(images, out, strict=True):
        matches = [i for i, s in enumerate(_shifts_of(image)) if np.array_equal(s, result)]
        assert matches, "an output that is no one-pixel shift of its input"
        moved += 4 not in matches
    return moved


def _torch_layer(fraction: float) -> Callable[[np.ndarray, bool], np.ndarray]:
    import torch

    from svc_trainer.backends.torch.models import RandomShift

    layer = RandomShift(fraction)
    torch.manual_seed(0)

    def apply(x: np.ndarray, training: bool) -> np.ndarray:
        layer.train(training)
        return layer(torch.as_tensor(x)).numpy()

    return apply


def _keras_layer(fraction: float) -> Callable[[np.ndarray, bool], np.ndarray]:
    from svc_trainer.backends.tensorflow.models import random_shift

    layer = random_shift(fraction)
    return lambda x, training: np.asarray(layer(x, training=training))


@pytest.mark.parametrize("layer_of", [_torch_layer, _keras_layer], ids=["torch", "keras"])
def test_a_share_of_the_images_moves_while_training_and_none_at_serving(
    layer_of: Callable[[float], Callable[[np.ndarray, bool], np.ndarray]],
) -> None:
    images = np.random.default_rng(0).random((400, 8, 8)).astype(np.float32) + 0.5
    everything = layer_of(1.0)
    assert _moved(images, everything(images, True)) == pytest.approx(400 * 8 / 9, abs=40)
    some = layer_of(0.3)
    assert _moved(images, some(images, True)) == pytest.approx(400 * 0.3 * 8 / 9, abs=35)
    assert np.array_equal(everything(images, False), images)
    assert np.array_equal(layer_of(0.0)(images, True), images)


def test_an_augmented_torch_model_exports_without_the_augmentation(tmp_path: Path) -> None:
    import torch

    from svc_trainer.backends.torch import models as torch_models
    from svc_trainer.backends.torch import runner as torch_runner

    data = digits_splits(limit=200)
    model = torch_models.build("cnn", Hyperparams(filters=4, units=8, augment=0.5), data)
    assert isinstance(model[0], torch_models.RandomShift)
    path = torch_runner.export(model, data, tmp_path)
    program = torch.export.load(str(path))
    x = torch.as_tensor(data.x_test[:16])
    expected = torch.softmax(model.eval()(x), dim=-1)
    assert torch.allclose(program.module()(x), expected, atol=1e-6)


def test_augment_is_a_share() -> None:
    from svc_trainer.plan import TrialError

    with pytest.raises(TrialError, match="augment"):
        Hyperparams.from_params({"augment": 1.5})
