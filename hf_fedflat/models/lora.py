"""LoRA through ``peft``: only the adapters and the classification head are trained and federated.

The federated state is "every parameter with ``requires_grad``" (:class:`hf_fedflat.ParameterSpace`).
Wrapping a model with :func:`apply_lora` freezes the backbone and leaves trainable only the LoRA
matrices and a trainable copy of the head (peft's ``modules_to_save``), so every round sends,
perturbs, corrects and aggregates those few tensors and nothing else. For a ViT-B/32 with r=8 on
every block's ``qkv``/``proj``/``fc1``/``fc2`` that is about 1.4% of the model's bytes.

>>> from hf_fedflat.models import create_model
>>> from hf_fedflat.models.lora import LoraArguments, apply_lora, save_federated_model
>>> model = apply_lora(create_model("vit_base_patch32_224", 65, image_size=224), LoraArguments(use_lora=True))
>>> # ... federated training ...
>>> save_federated_model(model, "out", lora_save="merged")   # load_model("out") -> plain model

The wrapper is ``peft.PeftModel`` (no task type): its forward passes ``pixel_values`` / ``input_ids``
and ``labels`` straight to the wrapped model, which returns ``loss`` and ``logits`` as before, and the
``Trainer`` reads the label names and input columns from the wrapped model.

Pieces (see peft's LoRA docs for the method itself, Hu et al., ICLR 2022):

* :class:`LoraArguments`: the options, parseable by ``HfArgumentParser`` and validated on creation.
* :func:`apply_lora`: wrap a model; the targets must match at least one module.
* :func:`save_federated_model`: a merged full model (``load_model`` reloads it) or the adapter alone.
* :func:`trainable_parameter_bytes`, :func:`total_parameter_bytes`: what a round exchanges.
"""

from __future__ import annotations

import contextlib
import copy
import os
import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import nn
from ..field_checks import ConfigError

__all__ = [
    "DEFAULT_LORA_TARGET_MODULES",
    "LORA_SAVE_CHOICES",
    "LoraArguments",
    "PEFT_TASK_HEADS",
    "apply_lora",
    "classification_head_names",
    "frozen_parameter_digest",
    "is_peft_model",
    "quiet_peft",
    "resolved_target_modules",
    "save_federated_model",
    "total_parameter_bytes",
    "trainable_parameter_bytes",
]

DEFAULT_LORA_TARGET_MODULES = r"(.*\.)?blocks\.\d+\.(attn\.(qkv|proj)|mlp\.(fc1|fc2))"
"""Attention and MLP linears inside transformer blocks: timm ViTs and ``char_transformer``.

A regular expression, fully matched against module names (peft's string form). It deliberately
names ``blocks.<i>.attn.proj``: the bare suffix ``"proj"`` would also match the patch-embedding
convolution ``patch_embed.proj`` of a ViT.
"""

LORA_SAVE_CHOICES = ("merged", "adapter")

# A value made only of name characters (and commas) is a list of module-name suffixes; anything else
# is a regular expression.
_NAME_LIST = re.compile(r"[\w.\-]+(\s*,\s*[\w.\-]+)*")


@dataclass
class LoraArguments:
    """LoRA options of a federated run (``HfArgumentParser``-ready; bad values fail on creation).

    Every ``ValueError`` raised here starts with the name of the offending field.
    """

    use_lora: bool = field(
        default=False,
        metadata={"help": "Fine-tune LoRA adapters (and the classification head) instead of all weights. "
                          "Only the trainable parameters are federated."},
    )
    lora_r: int = field(default=8, metadata={"help": "Rank of the LoRA update matrices."})
    lora_alpha: int = field(
        default=16, metadata={"help": "LoRA scaling numerator: the update B @ A is multiplied by lora_alpha / lora_r."}
    )
    lora_dropout: float = field(default=0.0, metadata={"help": "Dropout on the LoRA branch input, in [0, 1)."})
    lora_target_modules: str = field(
        default=DEFAULT_LORA_TARGET_MODULES,
        metadata={
            "help": "Modules that get adapters: a regular expression fully matched against module names, or a "
                    "comma-separated list of module-name suffixes (e.g. 'qkv,fc1,fc2'), or 'all-linear'. The "
                    "default matches the attention and MLP linears inside transformer blocks (timm ViT and "
                    "char_transformer) and not the ViT patch embedding."
        },
    )
    lora_modules_to_save: list[str] | None = field(
        default=None,
        metadata={
            "help": "Modules trained in full next to the adapters (suffixes of module names). Default: the "
                    "model's classification head ('head' for ViT and the character models, 'fc' for ResNet, "
                    "'fc2' for the small CNNs)."
        },
    )
    lora_save: str = field(
        default="merged",
        metadata={
            "help": "How the final model is saved: 'merged' (adapters folded into a full model that load_model "
                    "reads) or 'adapter' (only adapters + head, for PeftModel.from_pretrained on the base model).",
            "choices": list(LORA_SAVE_CHOICES),
        },
    )

    def __post_init__(self) -> None:
        if isinstance(self.lora_r, bool) or not isinstance(self.lora_r, int) or self.lora_r < 1:
            raise ConfigError(f"lora_r must be a positive integer, got {self.lora_r!r}")
        if isinstance(self.lora_alpha, bool) or not isinstance(self.lora_alpha, (int, float)) or self.lora_alpha <= 0:
            raise ConfigError(f"lora_alpha must be a positive number, got {self.lora_alpha!r}")
        if not isinstance(self.lora_dropout, (int, float)) or not 0.0 <= self.lora_dropout < 1.0:
            raise ConfigError(f"lora_dropout must be in [0, 1), got {self.lora_dropout!r}")
        if not isinstance(self.lora_target_modules, str) or not self.lora_target_modules.strip():
            raise ConfigError(
                f"lora_target_modules must be a non-empty string (a regular expression or comma-separated "
                f"module names), got {self.lora_target_modules!r}"
            )
        if not _NAME_LIST.fullmatch(self.lora_target_modules.strip()):
            try:
                re.compile(self.lora_target_modules)
            except re.error as err:
                raise ConfigError(
                    f"lora_target_modules {self.lora_target_modules!r} is not a valid regular expression: {err}"
                ) from err
        if self.lora_modules_to_save is not None:
            if isinstance(self.lora_modules_to_save, str):
                self.lora_modules_to_save = [s.strip() for s in self.lora_modules_to_save.split(",") if s.strip()]
            bad = [m for m in self.lora_modules_to_save if not isinstance(m, str) or not m.strip()]
            if bad:
                raise ConfigError(f"lora_modules_to_save must be module names, got {self.lora_modules_to_save!r}")
        if self.lora_save not in LORA_SAVE_CHOICES:
            raise ConfigError(f"lora_save must be one of {', '.join(LORA_SAVE_CHOICES)}, got {self.lora_save!r}")

    def target_modules(self) -> str | list[str]:
        """``lora_target_modules`` in peft's form: a regex string, a list of suffixes, or ``"all-linear"``."""
        value = self.lora_target_modules.strip()
        if value == "all-linear" or not _NAME_LIST.fullmatch(value):
            return value
        return [name.strip() for name in value.split(",")]


# ------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------
def is_peft_model(model: nn.Module) -> bool:
    """Whether ``model`` is wrapped by peft (``PeftModel`` or a subclass)."""
    from peft import PeftModel

    return isinstance(model, PeftModel)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def classification_head_names(model: nn.Module) -> list[str]:
    """Full module names of ``model``'s classification head, for peft's ``modules_to_save``.

    Recognises the models of :func:`hf_fedflat.models.create_model`: timm backbones (their
    ``pretrained_cfg["classifier"]``: ``head`` for ViT, ``fc`` for ResNet), the small CNNs (``fc2``)
    and the next-character models (``head``).

    Returns:
        The names (e.g. ``["backbone.head"]``); empty when no head is recognised.
    """
    from .small_cnn import SmallCNN
    from .next_char import CharLSTMModel, CharTransformerModel

    from .auto import is_auto_model

    if is_auto_model(model) and not hasattr(model, "timm_model"):
        # transformers image classifiers (ViT, ConvNext, ...): the head is a top-level `classifier`
        return [n for n in ("classifier", "score", "head") if isinstance(getattr(model, n, None), nn.Module)][:1]
    for prefix, module in model.named_modules():
        if isinstance(module, SmallCNN):
            return [_join(prefix, "fc2")]
        if isinstance(module, (CharLSTMModel, CharTransformerModel)):
            return [_join(prefix, "head")]
        cfg = getattr(module, "pretrained_cfg", None)
        if isinstance(cfg, dict) and cfg.get("classifier"):
            names = cfg["classifier"]
            names = [names] if isinstance(names, str) else list(names)
            modules = dict(module.named_modules())
            return [_join(prefix, n) for n in names if n in modules]
    return []


_LAYER_TYPES = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Embedding, nn.RNNBase)


def _linear_names(model: nn.Module, limit: int = 8) -> str:
    """The first layer names of ``model``, for error messages."""
    names = [n for n, m in model.named_modules() if isinstance(m, _LAYER_TYPES)]
    shown = ", ".join(names[:limit]) + (", ..." if len(names) > limit else "")
    return shown or "none"


@contextlib.contextmanager
def quiet_peft() -> Iterator[None]:
    """Silence one known, harmless warning while peft wraps or loads a model.

    peft 0.21 reads ``model.is_gradient_checkpointing``, which transformers 5.x deprecates with a
    ``FutureWarning`` on every wrap; nothing in hf_fedflat uses gradient checkpointing.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        yield


def frozen_parameter_digest(model: nn.Module) -> str:
    """SHA-256 over the names and values of the frozen parameters (``requires_grad=False``).

    Under LoRA a checkpoint holds only the trainable parameters; resuming is right only on the same
    frozen base. Store this digest with the checkpoint and compare it on resume.
    """
    import hashlib

    digest = hashlib.sha256()
    for name, param in model.named_parameters():
        if not param.requires_grad:
            digest.update(name.encode())
            digest.update(str(param.dtype).encode())
            digest.update(param.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def trainable_parameter_bytes(model: nn.Module) -> int:
    """Bytes of the parameters with ``requires_grad``: what one client sends per round."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def total_parameter_bytes(model: nn.Module) -> int:
    """Bytes of all parameters of ``model`` (each shared tensor once), frozen ones included.

    For a peft model this counts the frozen base, the adapters, and both the frozen original head and
    its trainable copy.
    """
    return sum(p.numel() * p.element_size() for p in model.parameters())


#: the heads peft's SEQ_CLS and TOKEN_CLS task types put in ``modules_to_save`` themselves
PEFT_TASK_HEADS = ("classifier", "score")


def _saved_by(name: str, modules_to_save: list[str]) -> bool:
    """Whether peft's ``modules_to_save`` takes module ``name`` (or a module holding it): peft matches by a plain
    ``str.endswith`` on the module name, so ``classifier`` also takes DistilBERT's ``pre_classifier``."""
    parts = name.split(".")
    return any(".".join(parts[:i]).endswith(saved) for saved in modules_to_save for i in range(1, len(parts) + 1))


def _is_linear(module: nn.Module) -> bool:
    from transformers.pytorch_utils import Conv1D  # GPT-2's linear layers

    return isinstance(module, (nn.Linear, Conv1D))


def _names_regex(names: list[str]) -> str:
    """One regular expression fully matching ``names`` and the same layers of every other block: each
    ``.<number>.`` becomes ``.\\d+.`` and layers of one parent are grouped, so the expression stays short for a
    model of any depth (``distilbert\\.transformer\\.layer\\.\\d+\\.attention\\.(k_lin|q_lin)``)."""
    leaves: dict[str, set[str]] = {}
    for name in names:
        parent, _, leaf = name.rpartition(".")
        leaves.setdefault(re.sub(r"\\\.\d+(?=\\\.|$)", r"\\.\\d+", re.escape(parent)), set()).add(re.escape(leaf))
    groups = [(f"{parent}\\." if parent else "") + (next(iter(leaf)) if len(leaf) == 1 else f"({'|'.join(sorted(leaf))})")
              for parent, leaf in sorted(leaves.items())]
    return groups[0] if len(groups) == 1 else "(" + "|".join(groups) + ")"


def _attention_projections(model: nn.Module, excluded: list[str]) -> list[str]:
    """The linear layers inside the model's attention modules (a class named ``*Attention*``: query, key, value
    and output projections under any naming), or every linear layer when it has none; never a layer
    ``modules_to_save`` takes (the head) nor one ``excluded`` names."""
    attention = [n for n, m in model.named_modules() if n and "Attention" in type(m).__name__]
    linears = [n for n, m in model.named_modules() if n and _is_linear(m) and not _saved_by(n, excluded)]
    inside = [n for n in linears if any(n.startswith(a + ".") for a in attention)]
    return inside or linears


def _transformers_targets(model: nn.Module, excluded: list[str]) -> str | list[str]:
    """Targets for a transformers model given the default ``lora_target_modules``: peft's for the model's
    ``model_type`` when some module has them, else its attention projections (:func:`_attention_projections`;
    DistilBERT's ``q_lin``/``v_lin``/..., ALBERT's ``query``/``key``/...) as one regular expression."""
    from peft.utils import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as targets_by_type

    names = targets_by_type.get(getattr(getattr(model, "config", None), "model_type", None))
    if names:
        matched = [n for n, _ in model.named_modules() if n and n.rsplit(".", 1)[-1] in names]
        if matched and not any(_saved_by(n, excluded) for n in matched):
            return list(names)
    return _names_regex(_attention_projections(model, excluded))


def _output_layer_name(model: nn.Module) -> str | None:
    """The name of a transformers model's output embedding (``lm_head``), which LoRA does not target."""
    get = getattr(model, "get_output_embeddings", None)
    layer = get() if callable(get) else None
    return next((n for n, m in model.named_modules() if m is layer), None) if layer is not None else None


def resolved_target_modules(peft_model: nn.Module) -> str:
    """The ``lora_target_modules`` value that gives ``peft_model``'s adapters again (run_config.yaml records it):
    peft's regular expression as it is, a set of name suffixes as a sorted comma-separated list."""
    targets = next(iter(peft_model.peft_config.values())).target_modules
    return targets if isinstance(targets, str) else ",".join(sorted(targets))


# ------------------------------------------------------------------------------------------------
# wrapping and saving
# ------------------------------------------------------------------------------------------------
def apply_lora(model: nn.Module, lora_args: LoraArguments, task: str | None = None) -> nn.Module:
    """Wrap ``model`` with LoRA adapters so that only the adapters and the head are trainable.

    Args:
        model: A model of :func:`hf_fedflat.models.create_model`, a ``transformers`` model loaded by
            ``--model_name_or_path`` (:mod:`hf_fedflat.models.auto`), or any module peft can wrap.
        lora_args: The options; with ``use_lora=False`` the model is returned unchanged, so callers
            can apply it unconditionally.
        task: For a transformers model, its task (:data:`hf_fedflat.models.auto.TASKS`): it sets peft's
            ``task_type`` (``SEQ_CLS``, ``TOKEN_CLS``, ``CAUSAL_LM``; peft then keeps the classifier
            trainable itself, a causal LM trains adapters only); an image classifier keeps its head in
            ``modules_to_save``. With the default ``lora_target_modules`` a transformers model gets peft's
            targets for its ``model_type`` (``query``/``value`` for BERT, ``c_attn`` for GPT-2,
            ``q_proj``/``v_proj`` for Llama), or, when peft has none that match, the linear layers of its
            attention modules (DistilBERT's ``q_lin``, ``k_lin``, ``v_lin``, ``out_lin``). Never a layer that
            ``modules_to_save`` takes; the layers the checkpoint lacks (:func:`~.auto.newly_initialised_modules`)
            join ``modules_to_save``, so an adapter reloads to the model that was trained.

    Returns:
        A ``peft.PeftModel`` whose only parameters with ``requires_grad`` are the ``lora_A``/``lora_B``
        matrices and the ``modules_to_save`` copies. Build it with the same ``torch.manual_seed`` on
        every process: the adapter initialisation (``lora_A`` random, ``lora_B`` zero) is drawn here.

    Raises:
        ValueError: ``lora_target_modules`` matches no module of the model (the message lists some of
            its linear layers) or a module ``modules_to_save`` trains in full, ``lora_modules_to_save`` names a
            missing module or cannot be guessed, or ``model`` is already a peft model.
    """
    if not lora_args.use_lora:
        return model
    from peft import LoraConfig, get_peft_model
    from peft.tuners.tuners_utils import check_target_module_exists

    if is_peft_model(model):
        raise ConfigError("model: already wrapped by peft; apply_lora expects the plain model from create_model")
    from .auto import PEFT_TASK_TYPES, check_task, is_auto_model

    check_task(task)
    task_type = PEFT_TASK_TYPES.get(task) if task else None

    if lora_args.lora_modules_to_save is None and task_type is not None:
        # peft's SEQ_CLS / TOKEN_CLS add the classifier ("classifier"/"score") to modules_to_save itself.
        modules_to_save = []
    elif lora_args.lora_modules_to_save is None:
        modules_to_save = classification_head_names(model)
        if not modules_to_save:
            raise ConfigError(
                f"lora_modules_to_save: cannot tell which module of {type(model).__name__} is the classification "
                f"head; name it (e.g. ['head']), or pass [] to train the adapters alone. Its layers include: "
                f"{_linear_names(model)}"
            )
    else:
        modules_to_save = list(lora_args.lora_modules_to_save)
        names = [n for n, _ in model.named_modules()]
        missing = [m for m in modules_to_save if not any(n == m or n.endswith("." + m) for n in names)]
        if missing:
            raise ConfigError(
                f"lora_modules_to_save: {', '.join(missing)} matches no module of {type(model).__name__}; its "
                f"layers include: {_linear_names(model)}"
            )
    # Layers the checkpoint lacks (BERT's pooler under an MLM checkpoint) are drawn at random on every load: frozen
    # and left out of the adapter, the adapter would reload to another model. Train and save them with it.
    saved = modules_to_save + list(PEFT_TASK_HEADS if task_type in ("SEQ_CLS", "TOKEN_CLS") else ())
    from .auto import newly_initialised_modules

    new_layers = [n for n in newly_initialised_modules(model) if not _saved_by(n, saved)]
    modules_to_save += new_layers
    saved += new_layers
    output_layer = _output_layer_name(model)
    target_modules = lora_args.target_modules()
    if target_modules == "all-linear" and any(_saved_by(n, saved) for n, m in model.named_modules() if _is_linear(m)):
        # peft's all-linear would wrap a layer modules_to_save then wraps again (peft refuses): every other linear
        target_modules = _names_regex([n for n, m in model.named_modules() if n and _is_linear(m)
                                       and not _saved_by(n, saved) and n != output_layer])
    if is_auto_model(model) and lora_args.lora_target_modules == DEFAULT_LORA_TARGET_MODULES:
        target_modules = _transformers_targets(model, saved + ([output_layer] if output_layer else []))

    config = LoraConfig(
        r=lora_args.lora_r,
        lora_alpha=lora_args.lora_alpha,
        lora_dropout=float(lora_args.lora_dropout),
        target_modules=target_modules,
        modules_to_save=modules_to_save or None,
        bias="none",
        task_type=task_type,
    )
    if config.target_modules != "all-linear":
        targets = [n for n, _ in model.named_modules() if n and check_target_module_exists(config, n)]
        if not targets:
            raise ConfigError(
                f"lora_target_modules: {lora_args.lora_target_modules!r} matches no module of "
                f"{type(model).__name__}. Give a regular expression fully matching module names or a "
                f"comma-separated list of name suffixes; its layers include: {_linear_names(model)}"
            )
        clashes = [n for n in targets if _saved_by(n, saved)]
        if clashes:
            raise ConfigError(
                f"lora_target_modules: {lora_args.lora_target_modules!r} matches {', '.join(clashes[:3])}, which is "
                f"trained in full (modules_to_save: {', '.join(saved)}); name targets outside the head, e.g. the "
                f"attention projections."
            )
    with quiet_peft():
        peft_model = get_peft_model(model, config)
    _record_base_model(peft_model)
    unexpected = [n for n, p in peft_model.named_parameters()
                  if p.requires_grad and "lora_" not in n and ".modules_to_save." not in n]
    if unexpected:  # an explicit check, not `assert`: it must also hold under `python -O`
        raise RuntimeError(f"LoRA left base parameters trainable: {unexpected[:5]}")
    return peft_model


def _record_base_model(peft_model: nn.Module) -> None:
    """Make ``base_model_name_or_path`` (what ``adapter_config.json`` says to load the adapter on) hold on any
    machine and from any working directory: peft records the name the model was loaded by, a relative path as
    typed; this is the Hub id and commit when the folder is a Hub download, else the absolute path
    (:func:`hf_fedflat.models.origin.base_model_reference`)."""
    from .origin import base_model_reference

    for adapter_config in peft_model.peft_config.values():
        name = adapter_config.base_model_name_or_path
        if name:
            adapter_config.base_model_name_or_path, revision = base_model_reference(name)
            if revision and not adapter_config.revision:
                adapter_config.revision = revision


def save_federated_model(model: nn.Module, directory: str | os.PathLike, lora_save: str = "merged") -> str:
    """Save a (possibly LoRA-wrapped) model in the form ``lora_save`` asks for.

    Args:
        model: A model of ``create_model``, or one wrapped by :func:`apply_lora`.
        directory: Output directory (created if needed).
        lora_save: ``"merged"``: the adapters are folded into the weights (on a copy; ``model`` is left
            as it is) and a plain full model is written with ``save_pretrained``
            (``config.json`` + ``model.safetensors``, reloaded by :func:`hf_fedflat.models.load_model`).
            ``"adapter"``: only the adapters and the ``modules_to_save`` copies, with peft's
            ``save_pretrained`` (``adapter_config.json`` + ``adapter_model.safetensors``), reloaded by
            ``PeftModel.from_pretrained(base_model, directory)`` or ``load_model(directory,
            base_model=...)``.

    Returns:
        ``directory`` as a string.

    Raises:
        ValueError: Unknown ``lora_save``, or ``"adapter"`` for a model without adapters.
    """
    if lora_save not in LORA_SAVE_CHOICES:
        raise ConfigError(f"lora_save must be one of {', '.join(LORA_SAVE_CHOICES)}, got {lora_save!r}")
    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)
    if not is_peft_model(model):
        if lora_save == "adapter":
            raise ConfigError("lora_save='adapter' needs a model wrapped by apply_lora; this one has no adapters")
        model.save_pretrained(directory)
        return directory
    if lora_save == "adapter":
        model.save_pretrained(directory)
        # The trained model's config (its id2label / num_labels) beside the adapter: the base checkpoint's config
        # says nothing about the head trained here. The adapter files decide how the folder loads.
        config = getattr(model.get_base_model(), "config", None)
        if config is not None and hasattr(config, "save_pretrained"):
            config.save_pretrained(directory)
        return directory
    # Merge on a copy: merge_and_unload() rewrites the live model in place, and unmerging by
    # subtraction would not restore the frozen weights bit for bit.
    merged = copy.deepcopy(model).merge_and_unload(safe_merge=True)
    merged.save_pretrained(directory)
    return directory
