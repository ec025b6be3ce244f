"""A timm data config (``timm.data.resolve_data_config``'s keys) that no real model has: 20x20 inputs, bicubic,
its own mean and std, a centre crop of 0.8; the image-transform and CIFAR tests read their expectations from it."""

TIMM_CONFIG = {
    "input_size": (3, 20, 20), "interpolation": "bicubic", "mean": (0.5, 0.4, 0.3),
    "std": (0.2, 0.25, 0.5), "crop_pct": 0.8, "crop_mode": "center",
}
