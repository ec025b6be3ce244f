"""Image datasets from the Hub or a local folder, and lazy image transforms (plain or timm's).

Two concerns every image loader of :mod:`hf_fedflat.data` shares live here:

**Where the images come from** (:func:`load_image_dataset`). A Hub name
(``"uoft-cs/cifar10"``) goes through :func:`datasets.load_dataset`; a local folder is either a
:meth:`datasets.Dataset.save_to_disk` / :meth:`datasets.DatasetDict.save_to_disk` folder or an
image folder ``<split>/<class>/<image>`` read with datasets' ``imagefolder`` builder. This
machine, CI and many clusters have no Hub access: a Hub name that cannot be reached raises
:class:`DatasetUnavailableError` saying to pass a local path via ``data_dir=...`` (with
``HF_HUB_OFFLINE=1`` that happens at once instead of after retries).

**How images become ``pixel_values``** (:func:`image_transform`, :func:`timm_transform`). Both
return a batch function for :meth:`datasets.Dataset.with_transform`: images are decoded and
preprocessed only when a batch is read, so nothing is materialised twice and ``select`` (client
subsets) keeps the transform. Both produce ``{"pixel_values": float32 [B, C, H, W], "labels":
int64 [B]}`` and both convert the channels to what the model wants (grey -> 3 channels by
repetition, colour -> 1 channel with PIL's ``"L"`` luminance). :func:`timm_transform` runs timm's
own evaluation pipeline (``timm.data.create_transform(**data_config)``: resize to
``size / crop_pct``, centre crop, normalise with the pretrained mean/std), image by image on PIL
images as timm does, so a pretrained timm model sees what it was trained on.

Optional train-time augmentation (``train_augmentation=True``) is the one of the CIFAR papers
(FedSAM, FedLESAM, FedGAM): a random crop of the stored size after zero padding by ``padding``
pixels, then a horizontal flip with probability 1/2, applied at the stored resolution before
resizing. It draws from torch's global generator, so ``transformers.set_seed`` (called by the
Trainer) makes it reproducible. Evaluation transforms are deterministic.

Loaders built on this module store images in a column ``image`` and class ids in a column
``label`` (a ``ClassLabel``), whatever the source calls them, so partitioners and
:class:`~hf_fedflat.federation.FederatedTrainer` work with their default ``label_column="label"``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch
import torch.nn.functional as F

from hf_fedflat.data.transforms import _per_channel, to_image_tensor
from ..field_checks import ConfigError

__all__ = [
    "IMAGE_COLUMN",
    "LABEL_COLUMN",
    "DatasetUnavailableError",
    "image_transform",
    "load_image_dataset",
    "resolve_data_config",
    "set_image_transforms",
    "timm_transform",
]

logger = logging.getLogger(__name__)

IMAGE_COLUMN = "image"
LABEL_COLUMN = "label"

_TIMM_KEYS = ("input_size", "interpolation", "mean", "std", "crop_pct", "crop_mode")


class DatasetUnavailableError(OSError):
    """A Hub dataset could not be reached (offline, no network, not found) and is not cached."""


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


def is_save_to_disk_folder(path: str | os.PathLike) -> bool:
    """True if ``path`` holds a ``save_to_disk`` ``Dataset`` or ``DatasetDict``."""
    path = Path(path)
    return (path / "dataset_dict.json").is_file() or (
        (path / "state.json").is_file() and (path / "dataset_info.json").is_file()
    )


def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", "./", "../", "~", ".\\")) or os.path.isabs(name)


def resolve_source(name_or_path: str, data_dir: str | os.PathLike | None) -> tuple[str, bool]:
    """Return ``(source, is_local)``: ``data_dir`` when given, else ``name_or_path``.

    Raises:
        DatasetUnavailableError: ``data_dir`` does not exist (the command line's one line, exit status 2).
        FileNotFoundError: a ``name_or_path`` that is clearly a path does not exist.
    """
    if data_dir is not None:
        path = Path(data_dir).expanduser()
        if not path.is_dir():
            raise DatasetUnavailableError(
                f"data_dir: {str(data_dir)!r} is not an existing folder; pass the folder holding "
                f"the dataset (a save_to_disk folder or an image folder)"
            )
        return str(path), True
    name = str(name_or_path)
    path = Path(name).expanduser()
    if path.is_dir():
        return str(path), True
    if _looks_like_path(name):
        raise FileNotFoundError(
            f"name_or_path={name!r} looks like a local path but is not an existing folder; "
            f"check the path, or pass a Hub dataset name"
        )
    return name, False


def hub_unavailable_error(name: str, err: BaseException, layout: str) -> DatasetUnavailableError:
    """The error raised when ``datasets.load_dataset(name)`` cannot reach the Hub."""
    return DatasetUnavailableError(
        f"name_or_path={name!r} is not a local folder and the Hugging Face Hub copy could not be "
        f"loaded ({type(err).__name__}: {err}). Pass a local path via data_dir=... (a "
        f"datasets save_to_disk folder, or an image folder {layout}), or run where the Hub is "
        f"reachable once so the dataset is cached."
    )


def hub_errors() -> tuple[type[BaseException], ...]:
    """Exception types meaning "the Hub copy is unreachable or missing"."""
    from datasets.exceptions import DatasetNotFoundError
    from huggingface_hub.errors import LocalEntryNotFoundError, OfflineModeIsEnabled

    errors: list[type[BaseException]] = [
        ConnectionError, TimeoutError, OfflineModeIsEnabled, LocalEntryNotFoundError,
        DatasetNotFoundError,
    ]
    try:
        import httpx

        errors.append(httpx.TransportError)
    except ImportError:  # pragma: no cover - huggingface_hub>=1 depends on httpx
        pass
    try:
        import requests

        errors.append(requests.exceptions.ConnectionError)
    except ImportError:  # pragma: no cover
        pass
    return tuple(errors)


def load_image_dataset(
    name_or_path: str,
    *,
    data_dir: str | os.PathLike | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> datasets.DatasetDict:
    """Load an image dataset from a local folder or the Hub, without any transform.

    Sources, tried in this order:

    1. ``data_dir`` (or ``name_or_path`` if it is an existing folder) holding a
       ``save_to_disk`` dataset: :func:`datasets.load_from_disk`. A single saved ``Dataset``
       becomes the ``"train"`` split.
    2. The same folder as an image folder ``<split>/<class>/<image>`` (e.g. ``train/cat/1.png``,
       ``test/cat/7.png``): datasets' ``imagefolder`` builder, which names the columns
       ``image`` and ``label`` (``ClassLabel`` of the class folder names, sorted, shared by all
       splits) and caches an index of the files (not the pixels) in ``cache_dir``.
    3. Otherwise ``name_or_path`` is a Hub name: :func:`datasets.load_dataset`.

    Args:
        name_or_path: Hub dataset name (e.g. ``"uoft-cs/cifar10"``) or a local folder.
        data_dir: a local copy of the dataset; takes precedence over ``name_or_path``.
        cache_dir: datasets cache folder (Hub downloads and the ``imagefolder`` index).

    Returns:
        The stored splits as a ``DatasetDict``.

    Raises:
        FileNotFoundError: ``data_dir`` does not exist.
        DatasetUnavailableError: a Hub name could not be loaded (offline, not found); the
            message says to pass ``data_dir=...``.
    """
    source, is_local = resolve_source(name_or_path, data_dir)
    cache = None if cache_dir is None else str(cache_dir)
    if is_local:
        if is_save_to_disk_folder(source):
            loaded = datasets.load_from_disk(source)
            if isinstance(loaded, datasets.Dataset):
                loaded = datasets.DatasetDict({"train": loaded})
            return loaded
        try:
            return datasets.load_dataset("imagefolder", data_dir=source, cache_dir=cache)
        except datasets.data_files.EmptyDatasetError as err:
            raise ConfigError(f"data_dir: {source} holds no image files; pass a folder laid out as "
                              "<split>/<class>/<image> (or a save_to_disk copy).") from err
    try:
        loaded = datasets.load_dataset(source, cache_dir=cache)
    except hub_errors() as err:
        raise hub_unavailable_error(source, err, "<split>/<class>/<image>") from err
    if isinstance(loaded, datasets.Dataset):
        loaded = datasets.DatasetDict({"train": loaded})
    return loaded


# --------------------------------------------------------------------------------------------
# Columns
# --------------------------------------------------------------------------------------------


def find_image_column(dataset: datasets.Dataset, image_column: str | None = None) -> str:
    """The image column: ``image_column`` if given, else the first ``Image`` feature."""
    if image_column is not None:
        if image_column not in dataset.column_names:
            raise ConfigError(
                f"image_column={image_column!r} is not a column of the dataset (columns: "
                f"{dataset.column_names}); pass the name of the image column"
            )
        return image_column
    for name, feature in dataset.features.items():
        if isinstance(feature, datasets.Image):
            return name
    for name in ("image", "img"):
        if name in dataset.column_names:
            return name
    raise ConfigError(
        f"image_column: no Image column found (columns: {dataset.column_names}); pass "
        f"image_column=<name of the column holding the images>"
    )


def column_values(dataset: datasets.Dataset, column: str) -> np.ndarray:
    """One column as a numpy array, read without decoding any other column or transform.

    ``[:]`` formats the whole column at once; ``np.asarray(ds.with_format("numpy")[column])``
    would iterate datasets' lazy ``Column`` row by row (about 10x slower).
    """
    return np.asarray(dataset.select_columns([column]).with_format("numpy")[:][column])


def class_ids(dataset: datasets.Dataset, column: str) -> tuple[np.ndarray, list[str]]:
    """Class ids (``int64 [n]``) and class names of ``column`` (``ClassLabel`` or plain values)."""
    if column not in dataset.column_names:
        raise ConfigError(
            f"{column!r} is not a column of the dataset (columns: {dataset.column_names})"
        )
    values = column_values(dataset, column)
    feature = dataset.features[column]
    if isinstance(feature, datasets.ClassLabel):
        return values.astype(np.int64).reshape(-1), list(feature.names)
    uniques, ids = np.unique(values, return_inverse=True)
    return ids.astype(np.int64).reshape(-1), [str(u) for u in uniques]


def _sorted_names(values: Sequence[Any]) -> list[Any]:
    uniques = set(values)
    if all(isinstance(v, (int, np.integer)) for v in uniques):
        return sorted(uniques, key=int)
    return sorted(uniques, key=str)


def encode_class_column(
    splits: Mapping[str, datasets.Dataset], column: str
) -> dict[str, datasets.Dataset]:
    """Make ``column`` a ``ClassLabel`` with the same class names in every split.

    Splits whose column already is a ``ClassLabel`` with one shared list of names are returned
    as they are. Otherwise the values (ints, strings or per-split ``ClassLabel`` names) of all
    splits are pooled, sorted (numerically for ints) and encoded, so a class has one index
    everywhere. Only that column is rewritten (``remove_columns`` + ``add_column``): the image
    column is not copied. Call it on freshly loaded splits (no ``select`` indices yet).
    """
    features = {name: split.features[column] for name, split in splits.items()}
    name_lists = [f.names for f in features.values() if isinstance(f, datasets.ClassLabel)]
    if len(name_lists) == len(features) and all(names == name_lists[0] for names in name_lists):
        return dict(splits)
    raw: dict[str, list[Any]] = {}
    for name, split in splits.items():
        values = column_values(split, column)
        feature = features[name]
        if isinstance(feature, datasets.ClassLabel):
            raw[name] = [feature.names[int(v)] for v in values]
        else:
            raw[name] = [v.item() if isinstance(v, np.generic) else v for v in values]
    names = _sorted_names([v for values in raw.values() for v in values])
    index = {value: i for i, value in enumerate(names)}
    class_label = datasets.ClassLabel(names=[str(n) for n in names])
    out = {}
    for name, split in splits.items():
        codes = np.asarray([index[v] for v in raw[name]], dtype=np.int64)
        out[name] = split.remove_columns(column).add_column(column, codes, feature=class_label)
    return out


def standardize_columns(
    dataset_dict: datasets.DatasetDict,
    *,
    image_column: str | None,
    label_column: str,
    extra_renames: Mapping[str, str] | None = None,
) -> datasets.DatasetDict:
    """Rename the image column to ``image`` and the label column to ``label`` (a ``ClassLabel``).

    ``extra_renames`` maps further source columns to new names (e.g. ``{"dom": "domain"}``).
    A column already holding the target name (and not the one being renamed) is an error.
    """
    first = next(iter(dataset_dict.values()))
    image_column = find_image_column(first, image_column)
    if label_column not in first.column_names:
        raise ConfigError(
            f"label_column={label_column!r} is not a column of the dataset (columns: "
            f"{first.column_names}); pass the name of the label column"
        )
    renames = {image_column: IMAGE_COLUMN, label_column: LABEL_COLUMN, **(extra_renames or {})}
    renames = {src: dst for src, dst in renames.items() if src != dst}
    clashes = [dst for src, dst in renames.items() if dst in first.column_names and dst not in renames]
    if clashes:
        raise ConfigError(
            f"label_column/image_column: cannot rename {renames} because the dataset already "
            f"has column(s) {clashes}; pass the column that holds the labels/images"
        )
    splits = {
        name: split.rename_columns(renames) if renames else split
        for name, split in dataset_dict.items()
    }
    return datasets.DatasetDict(encode_class_column(splits, LABEL_COLUMN))


def require_splits(dataset_dict: datasets.DatasetDict, splits: Sequence[str], where: str) -> None:
    """Raise a ``ValueError`` naming ``where`` if a required split is missing."""
    missing = [s for s in splits if s not in dataset_dict]
    if missing:
        raise ConfigError(
            f"{where}: the dataset has splits {list(dataset_dict)} but {list(splits)} are "
            f"needed (missing {missing}); an image folder needs the layout "
            f"{'/'.join(splits)} folders, each <split>/<class>/<image>"
        )


# --------------------------------------------------------------------------------------------
# Transforms
# --------------------------------------------------------------------------------------------


def _pil_mode(in_chans: int | None) -> str | None:
    return {1: "L", 3: "RGB"}.get(in_chans) if in_chans is not None else None


def _to_chw(image: Any, in_chans: int | None) -> torch.Tensor:
    """One image (PIL, array, nested list) as float32 ``[C, H, W]`` in ``[0, 1]`` for uint8."""
    from PIL import Image

    if isinstance(image, Image.Image):
        mode = _pil_mode(in_chans) or ("L" if image.mode in ("L", "1", "I;16", "I", "F") else "RGB")
        if image.mode != mode:
            image = image.convert(mode)
        image = np.asarray(image)
    tensor = to_image_tensor([np.asarray(image)])[0]
    return _match_channels(tensor, in_chans)


def _match_channels(tensor: torch.Tensor, in_chans: int | None) -> torch.Tensor:
    channels = tensor.shape[0]
    if in_chans is None or channels == in_chans:
        return tensor
    if channels == 4:  # RGBA / CMYK-like: drop the last channel first
        tensor, channels = tensor[:3], 3
        if in_chans == 3:
            return tensor
    if channels == 1:
        return tensor.expand(in_chans, -1, -1).contiguous()
    if channels == 3 and in_chans == 1:  # ITU-R 601-2 luma, as PIL's convert("L")
        weights = torch.tensor([0.299, 0.587, 0.114], dtype=tensor.dtype).view(3, 1, 1)
        return (tensor * weights).sum(dim=0, keepdim=True)
    raise ConfigError(f"in_chans={in_chans}: cannot convert an image with {channels} channels")


def _random_crop_flip(image: Any, padding: int) -> Any:
    """Pad by ``padding`` zeros, crop back to the original size at a random offset, flip 1/2.

    Works on PIL images and ``[C, H, W]`` tensors (torchvision's functional ops); draws from
    torch's global generator.
    """
    import torchvision.transforms.functional as TF

    if isinstance(image, torch.Tensor):
        height, width = image.shape[-2:]
    else:
        width, height = image.size
    if padding > 0:
        image = TF.pad(image, [padding])
        top = int(torch.randint(0, 2 * padding + 1, (1,)))
        left = int(torch.randint(0, 2 * padding + 1, (1,)))
        image = TF.crop(image, top, left, height, width)
    if float(torch.rand(1)) < 0.5:
        image = TF.hflip(image)
    return image


def _labels(batch: Mapping[str, Any], label_column: str) -> dict[str, torch.Tensor]:
    if label_column not in batch:
        return {}
    return {"labels": torch.as_tensor(np.asarray(batch[label_column], dtype=np.int64))}


def _check_image_column(batch: Mapping[str, Any], image_column: str) -> None:
    if image_column not in batch:
        raise KeyError(
            f"image_column={image_column!r} is not in the batch (columns: {sorted(batch)}); "
            f"pass the right image_column"
        )


def image_transform(
    image_size: int | tuple[int, int] | None,
    mean: float | Sequence[float],
    std: float | Sequence[float],
    *,
    in_chans: int | None = 3,
    image_column: str = IMAGE_COLUMN,
    label_column: str = LABEL_COLUMN,
    train_augmentation: bool = False,
    padding: int = 4,
) -> Callable[[dict[str, list]], dict[str, torch.Tensor]]:
    """Batch transform: decode, (augment), resize, normalise -> ``pixel_values`` and ``labels``.

    For datasets whose images share a size (CIFAR 32x32, MNIST 28x28) the whole batch is resized
    with one bilinear :func:`torch.nn.functional.interpolate` call (antialiased when shrinking);
    images of different sizes are resized one by one. Unlike
    :func:`~hf_fedflat.data.transforms.image_classification_transform` it decodes PIL images of
    any mode, converts channels to ``in_chans`` and can augment.

    Args:
        image_size: output side (or ``(height, width)``); ``None`` keeps the stored size (all
            images of a batch must then share it).
        mean, std: per-channel normalisation (one number for all channels or one per channel).
        in_chans: channels of ``pixel_values`` (1 or 3); ``None`` keeps the stored channels.
        image_column, label_column: stored columns read from the batch.
        train_augmentation: random crop (zero padding ``padding``) + horizontal flip, at the
            stored resolution, before resizing.
        padding: padding of the random crop, in stored pixels.

    Returns:
        ``fn(batch) -> {"pixel_values": float32 [B, C, H, W], "labels": int64 [B]}``.
    """
    size = _check_size(image_size)
    mean_t = _per_channel(mean, "mean")
    std_t = _per_channel(std, "std")
    padding = _check_padding(padding)

    def transform(batch: dict[str, list]) -> dict[str, torch.Tensor]:
        _check_image_column(batch, image_column)
        images = [_to_chw(image, in_chans) for image in batch[image_column]]
        if train_augmentation:
            images = [_random_crop_flip(image, padding) for image in images]
        shapes = {tuple(image.shape) for image in images}
        if len(shapes) > 1:
            if size is None:
                raise ConfigError(
                    f"image_size: images of one batch have different shapes {sorted(shapes)}; "
                    f"pass image_size=... (or a timm data_config) to resize them to one size"
                )
            images = [_resize(image[None], size)[0] for image in images]
        if images:
            pixels = torch.stack(images)
            if size is not None:
                pixels = _resize(pixels, size)
        else:
            pixels = torch.zeros(0, in_chans or 1, *(size or (1, 1)))
        if mean_t.shape[1] not in (1, pixels.shape[1]):
            raise ConfigError(
                f"mean/std have {mean_t.shape[1]} channels but the images have "
                f"{pixels.shape[1]}; pass in_chans={mean_t.shape[1]} or matching mean/std"
            )
        return {"pixel_values": (pixels - mean_t) / std_t, **_labels(batch, label_column)}

    # without augmentation, the same batch gives the same output: evaluation may keep it (hf_fedflat.runtime.eval_data)
    transform.deterministic = not train_augmentation
    return transform


def _resize(pixels: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    if tuple(pixels.shape[-2:]) == size:
        return pixels
    shrink = pixels.shape[-2] > size[0] or pixels.shape[-1] > size[1]
    return F.interpolate(pixels, size=size, mode="bilinear", align_corners=False, antialias=shrink)


def _check_size(image_size: int | tuple[int, int] | None) -> tuple[int, int] | None:
    if image_size is None:
        return None
    size = (image_size, image_size) if isinstance(image_size, (int, np.integer)) else tuple(image_size)
    if len(size) != 2 or any(isinstance(s, bool) or int(s) < 1 for s in size):
        raise ConfigError(f"image_size must be a positive int or (height, width), got {image_size!r}")
    return int(size[0]), int(size[1])


def _check_padding(padding: int) -> int:
    if isinstance(padding, bool) or not isinstance(padding, (int, np.integer)) or padding < 0:
        raise ConfigError(f"padding must be an int >= 0 (random-crop padding in pixels), got {padding!r}")
    return int(padding)


def _first_conv_in_channels(model: torch.nn.Module) -> int | None:
    for module in model.modules():
        if isinstance(module, torch.nn.Conv2d):
            return int(module.in_channels)
    return None


def _model_input_size(wrapper: torch.nn.Module, model: torch.nn.Module) -> tuple[int, int] | None:
    """The input size a model was built for, when it says so (else timm's pretrained size).

    A :class:`~hf_fedflat.models.modeling.FedFlatImageClassifier` records it as
    ``config.image_size``; a timm ViT built with ``img_size=...`` (and a fixed size) as
    ``patch_embed.img_size``. Convolutional timm models take any size: their pretrained
    ``input_size`` is used.
    """
    config = getattr(wrapper, "config", None)
    image_size = getattr(config, "image_size", None) if wrapper is not model else None
    if image_size is not None:
        return _check_size(image_size)
    patch_embed = getattr(model, "patch_embed", None)
    img_size = getattr(patch_embed, "img_size", None)
    if img_size is not None and getattr(patch_embed, "strict_img_size", True) \
            and not getattr(patch_embed, "dynamic_img_size", False):
        return _check_size(tuple(img_size))
    return None


def resolve_data_config(
    model_or_config: torch.nn.Module | Mapping[str, Any],
    *,
    in_chans: int | None = None,
) -> dict[str, Any]:
    """A complete timm data config (``input_size``, ``interpolation``, ``mean``, ``std``, ...).

    Args:
        model_or_config: a timm model, a model wrapping one as ``.backbone`` (what
            :func:`hf_fedflat.models.create_model` returns), or a dict such as
            ``timm.data.resolve_model_data_config(model)`` returns (missing keys get timm's
            defaults through ``timm.data.resolve_data_config``). For a model, ``mean``,
            ``std``, ``interpolation`` and ``crop_pct`` come from its pretrained config and the
            input size from what the model was built for: ``config.image_size`` of a
            ``create_model`` model, ``patch_embed.img_size`` of a timm ViT, else the pretrained
            ``input_size`` (convolutional timm models take any size).
        in_chans: channels the model takes. For a model it defaults to ``config.in_chans`` or
            the input channels of its first convolution, since timm's pretrained config says 3
            even for a model built with ``in_chans=1``. When it differs from the config,
            ``input_size`` takes it and ``mean``/``std`` are averaged (3 -> 1) or repeated
            (1 -> 3).

    Returns:
        A new dict with at least the keys ``input_size`` ``(C, H, W)``, ``interpolation``,
        ``mean``, ``std``, ``crop_pct``, ``crop_mode``.

    Raises:
        ValueError: a model that carries no timm ``pretrained_cfg`` (e.g. ``small_cnn``: pass
            ``image_size`` instead), or an inconsistent config.
    """
    import timm.data

    if isinstance(model_or_config, torch.nn.Module):
        model = getattr(model_or_config, "backbone", model_or_config)
        if not isinstance(model, torch.nn.Module) or not (
            getattr(model, "pretrained_cfg", None) or getattr(model, "default_cfg", None)
        ):
            raise ConfigError(
                f"data_config: {type(model_or_config).__name__} is not a timm model (no "
                f"pretrained_cfg); pass image_size=... instead, or a data-config dict"
            )
        config = dict(timm.data.resolve_model_data_config(model))
        size = _model_input_size(model_or_config, model)
        if size is not None:
            config["input_size"] = (config["input_size"][0], *size)
        if in_chans is None:
            in_chans = getattr(getattr(model_or_config, "config", None), "in_chans", None)
            in_chans = in_chans if in_chans is not None else _first_conv_in_channels(model)
    elif isinstance(model_or_config, Mapping):
        args = {k: v for k, v in model_or_config.items() if v is not None}
        unknown = sorted(set(args) - set(_TIMM_KEYS) - {"img_size", "in_chans", "chans"})
        if unknown:
            raise ConfigError(
                f"data_config has unknown keys {unknown}; expected some of {list(_TIMM_KEYS)}"
            )
        input_size = args.get("input_size")
        channels = int(input_size[0]) if input_size is not None and len(input_size) == 3 else 3
        for key in ("mean", "std"):  # timm asserts on a mismatch; resolve it (or fail) here
            if key in args and len(tuple(args[key])) not in (1, channels):
                raise ConfigError(
                    f"data_config[{key!r}] has {len(tuple(args[key]))} values but input_size has "
                    f"{channels} channels; give one value per channel"
                )
        config = dict(timm.data.resolve_data_config(args=args))
    else:
        raise TypeError(
            f"data_config must be a timm model or a dict, got {type(model_or_config).__name__}"
        )
    input_size = tuple(int(s) for s in config["input_size"])
    if len(input_size) != 3 or min(input_size) < 1:
        raise ConfigError(f"data_config['input_size'] must be (C, H, W) > 0, got {config['input_size']}")
    mean = tuple(float(v) for v in config["mean"])
    std = tuple(float(v) for v in config["std"])
    if in_chans is not None and int(in_chans) != input_size[0]:
        in_chans = int(in_chans)
        if in_chans not in (1, 3):
            raise ConfigError(f"in_chans must be 1 or 3, got {in_chans}")
        input_size = (in_chans, *input_size[1:])
        if len(mean) != in_chans:
            mean = (sum(mean) / len(mean),) * in_chans
            std = (sum(std) / len(std),) * in_chans
    if len(mean) != input_size[0] or len(std) != input_size[0] or min(std) <= 0:
        raise ConfigError(
            f"data_config: mean {mean} / std {std} must have {input_size[0]} values each, std > 0"
        )
    config.update(input_size=input_size, mean=mean, std=std)
    return config


def timm_transform(
    data_config: torch.nn.Module | Mapping[str, Any],
    *,
    image_column: str = IMAGE_COLUMN,
    label_column: str = LABEL_COLUMN,
    train_augmentation: bool = False,
    padding: int = 4,
) -> Callable[[dict[str, list]], dict[str, torch.Tensor]]:
    """Batch transform running timm's evaluation preprocessing for ``data_config``.

    The pipeline is ``timm.data.create_transform(**data_config, is_training=False)``: resize the
    shorter side to ``floor(size / crop_pct)`` (``interpolation``, antialiased), centre crop to
    ``input_size[1:]``, scale to ``[0, 1]``, normalise with ``mean``/``std``. It runs per image
    on PIL images (as in timm's own loaders) after converting them to ``input_size[0]``
    channels; images stored as arrays go through the same pipeline as tensors.

    Args:
        data_config: a dict from ``timm.data.resolve_model_data_config(model)`` /
            ``resolve_data_config``, or the model itself (see :func:`resolve_data_config`).
        image_column, label_column: stored columns read from the batch.
        train_augmentation: the papers' random crop (zero padding ``padding``) + horizontal
            flip, at the stored resolution, before timm's deterministic pipeline.
        padding: padding of the random crop, in stored pixels.

    Returns:
        ``fn(batch) -> {"pixel_values": float32 [B, *input_size], "labels": int64 [B]}``.

    Example:
        >>> model = timm.create_model("resnet18", pretrained=False, num_classes=10)
        >>> train = dataset.with_transform(timm_transform(model))
    """
    import timm.data
    from PIL import Image

    config = resolve_data_config(data_config)
    in_chans = int(config["input_size"][0])
    mode = _pil_mode(in_chans)
    padding = _check_padding(padding)
    pipeline = timm.data.create_transform(
        **{k: config[k] for k in _TIMM_KEYS if k in config}, is_training=False
    )

    def one(image: Any) -> torch.Tensor:
        if isinstance(image, Image.Image):
            if image.mode != mode:
                image = image.convert(mode)
        else:
            image = _to_chw(image, in_chans)
        if train_augmentation:
            image = _random_crop_flip(image, padding)
        return pipeline(image)

    def transform(batch: dict[str, list]) -> dict[str, torch.Tensor]:
        _check_image_column(batch, image_column)
        images = [one(image) for image in batch[image_column]]
        pixels = torch.stack(images) if images else torch.zeros(0, *config["input_size"])
        return {"pixel_values": pixels.float(), **_labels(batch, label_column)}

    transform.deterministic = not train_augmentation  # (see image_transform)
    return transform


def set_image_transforms(
    dataset_dict: datasets.DatasetDict,
    *,
    mean: float | Sequence[float],
    std: float | Sequence[float],
    in_chans: int | None,
    image_size: int | tuple[int, int] | None = None,
    data_config: torch.nn.Module | Mapping[str, Any] | None = None,
    train_augmentation: bool = False,
    train_split: str = "train",
) -> datasets.DatasetDict:
    """Set the lazy transforms: augmented on ``train_split`` if asked, deterministic elsewhere.

    With ``data_config`` (a timm model or data-config dict) every split gets
    :func:`timm_transform` (its size, channels, mean and std win over the other arguments);
    otherwise :func:`image_transform` with ``image_size`` (``None`` keeps the stored size),
    ``mean``, ``std`` and ``in_chans``. The stored columns must be ``image`` and ``label``.

    Returns:
        A new ``DatasetDict`` sharing the Arrow data; read the raw columns back with
        :func:`~hf_fedflat.data.transforms.without_transform`.
    """
    if data_config is not None and image_size is not None:
        raise ConfigError(
            "image_size and data_config were both given; data_config sets the input size, "
            "pass only one of them"
        )

    def build(augment: bool):
        if data_config is not None:
            return timm_transform(data_config, train_augmentation=augment)
        return image_transform(
            image_size, mean, std, in_chans=in_chans, train_augmentation=augment
        )

    eval_fn = build(False)
    train_fn = build(True) if train_augmentation else eval_fn
    return datasets.DatasetDict({
        name: split.with_transform(train_fn if name == train_split else eval_fn)
        for name, split in dataset_dict.items()
    })
