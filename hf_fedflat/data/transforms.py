"""Batch-wise, vectorised on-the-fly preprocessing for image-classification datasets.

The transforms here are meant for :meth:`datasets.Dataset.with_transform`. The
``Trainer``'s DataLoader fetches a whole batch with ``dataset[indices]`` (through
``Dataset.__getitems__``), so the transform sees the batch at once: it stacks the images
into one tensor and resizes them with a single :func:`torch.nn.functional.interpolate`
call, instead of a Python loop per image.

A dataset with a transform set only returns the transform's output columns
(``pixel_values`` and ``labels``), so the ``Trainer`` must be told not to drop the
columns it cannot see in the model signature: ``TrainingArguments(remove_unused_columns=False)``.
Use :func:`without_transform` to get the raw columns back (e.g. to read ``label``
without decoding and resizing every image).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np
import torch
import torch.nn.functional as F
from ..field_checks import ConfigError

__all__ = [
    "image_classification_transform",
    "to_image_tensor",
    "without_transform",
]

_D = TypeVar("_D")


def to_image_tensor(images: Any) -> torch.Tensor:
    """Stack a batch of images into one float32 tensor of shape ``[B, C, H, W]``.

    Args:
        images: a batch as the ``datasets`` Python formatter delivers it: a list of
            nested lists / numpy arrays / PIL images, or an array/tensor. Each image is
            ``H x W`` (one channel) or ``H x W x C`` (channels last, the PIL/numpy
            convention). All images of the batch must have the same size. ``uint8``
            input is scaled to ``[0, 1]`` (divided by 255); float input is kept as is.

    Returns:
        A contiguous ``float32`` tensor ``[B, C, H, W]``.

    Raises:
        ValueError: if the images do not share one shape or are not 2-D/3-D.
    """
    if isinstance(images, torch.Tensor):
        array = images.detach().cpu().numpy()
    elif isinstance(images, np.ndarray):
        array = images
    else:
        items = [np.asarray(image) for image in images]  # PIL -> HxW(xC) uint8 arrays
        shapes = {item.shape for item in items}
        if len(shapes) > 1:
            raise ConfigError(
                f"images in one batch must share a shape to be resized together, got "
                f"{sorted(shapes)}; resize them to a common size first (e.g. in a "
                f"`dataset.map`) or use a per-image transform"
            )
        array = np.stack(items) if items else np.zeros((0, 1, 1), dtype=np.float32)
    if array.ndim == 3:  # [B, H, W] -> [B, 1, H, W]
        array = array[:, None]
    elif array.ndim == 4:  # [B, H, W, C] -> [B, C, H, W]
        array = array.transpose(0, 3, 1, 2)
    else:
        raise ConfigError(
            f"expected a batch of HxW or HxWxC images (3-D or 4-D batch), got a "
            f"{array.ndim}-D batch of shape {array.shape}"
        )
    is_uint8 = array.dtype == np.uint8
    tensor = torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))
    if is_uint8:
        tensor = tensor / 255.0
    return tensor


def _per_channel(value: float | Sequence[float], name: str) -> torch.Tensor:
    values = [float(value)] if isinstance(value, (int, float)) else [float(v) for v in value]
    if not values:
        raise ConfigError(f"{name} must be a number or a non-empty sequence of numbers")
    if name == "std" and any(v <= 0 for v in values):
        raise ConfigError(f"std must be > 0 for every channel, got {values}")
    return torch.tensor(values, dtype=torch.float32).view(1, -1, 1, 1)


def image_classification_transform(
    image_size: int | tuple[int, int],
    mean: float | Sequence[float],
    std: float | Sequence[float],
    image_column: str = "image",
    label_column: str = "label",
) -> Callable[[dict[str, list]], dict[str, torch.Tensor]]:
    """Build a batch transform: images -> ``pixel_values``, labels -> ``labels``.

    The returned function takes a batch dict (column -> list of values) and returns::

        {"pixel_values": float32 tensor [B, C, image_size, image_size],
         "labels": int64 tensor [B]}          # only if label_column is in the batch

    Images are stacked (see :func:`to_image_tensor`), bilinearly resized to
    ``image_size`` with one ``interpolate`` call for the whole batch (skipped when they
    already have that size), then normalised per channel: ``(x - mean) / std``.

    Set it with ``dataset.with_transform(fn)``; the ``Trainer`` then needs
    ``remove_unused_columns=False``, since the transformed columns are not stored ones.

    Args:
        image_size: output side length, or ``(height, width)``.
        mean: per-channel mean (a number for all channels, or one per channel).
        std: per-channel standard deviation (> 0).
        image_column: name of the image column in the stored dataset.
        label_column: name of the label column in the stored dataset.

    Returns:
        The batch transform.

    Example:
        >>> fn = image_classification_transform(32, mean=0.3053, std=0.3760)
        >>> out = fn({"image": [[[0.0] * 8] * 8] * 4, "label": [0, 1, 2, 3]})
        >>> tuple(out["pixel_values"].shape), out["labels"].dtype
        ((4, 1, 32, 32), torch.int64)
    """
    size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    if len(size) != 2 or any(int(s) < 1 for s in size):
        raise ConfigError(f"image_size must be a positive int or (height, width), got {image_size!r}")
    size = (int(size[0]), int(size[1]))
    mean_t = _per_channel(mean, "mean")
    std_t = _per_channel(std, "std")

    def transform(batch: dict[str, list]) -> dict[str, torch.Tensor]:
        if image_column not in batch:
            raise KeyError(
                f"image_column={image_column!r} is not in the batch (columns: "
                f"{sorted(batch)}); pass the right image_column"
            )
        pixels = to_image_tensor(batch[image_column])
        if pixels.shape[1] not in (1, mean_t.shape[1]) and mean_t.shape[1] != 1:
            raise ConfigError(
                f"mean/std have {mean_t.shape[1]} channels but the images have "
                f"{pixels.shape[1]}"
            )
        if tuple(pixels.shape[-2:]) != size and pixels.shape[0] > 0:
            pixels = F.interpolate(pixels, size=size, mode="bilinear", align_corners=False)
        pixels = (pixels - mean_t) / std_t
        out = {"pixel_values": pixels}
        if label_column in batch:
            out["labels"] = torch.as_tensor(np.asarray(batch[label_column], dtype=np.int64))
        return out

    # the same batch gives the same output: evaluation may keep it (hf_fedflat.runtime.eval_data)
    transform.deterministic = True
    return transform


def without_transform(dataset: _D) -> _D:
    """Return a view of ``dataset`` (``Dataset`` or ``DatasetDict``) with no transform.

    ``with_format(None)`` drops any transform/format and returns a new object sharing
    the same Arrow data (no copy); the input is left untouched. Use it to read stored
    columns (``image`` as 8x8 floats, ``label`` as ints) or to set another transform.
    """
    return dataset.with_format(None)
