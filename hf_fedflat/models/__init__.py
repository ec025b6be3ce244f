"""Models for federated fine-tuning: one factory, Trainer-ready outputs, Hugging Face saving.

>>> from hf_fedflat.models import create_model, load_model, has_batchnorm
>>> model = create_model("small_cnn", num_classes=10, in_chans=1, image_size=32)
>>> model.save_pretrained("out")            # config.json + model.safetensors
>>> same = load_model("out")
"""

from .backbones import available_models, build_backbone
from .factory import create_model, load_model
from .modeling import FedFlatClassifierConfig, FedFlatImageClassifier
from .norms import batchnorm_modules, has_batchnorm
from .small_cnn import SmallCNN

__all__ = [
    "create_model",
    "load_model",
    "available_models",
    "build_backbone",
    "has_batchnorm",
    "batchnorm_modules",
    "FedFlatClassifierConfig",
    "FedFlatImageClassifier",
    "SmallCNN",
]
