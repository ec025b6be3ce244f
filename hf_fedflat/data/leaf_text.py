"""LEAF's text datasets: Sent140 (tweet sentiment, one client per Twitter user) and Reddit (next-token
prediction, one client per Reddit user), read from LEAF's JSON files (:mod:`hf_fedflat.data.leaf`).

Both read the folder LEAF's preprocessing writes, ``train/*.json`` + ``test/*.json`` (or LEAF's
``data/<dataset>`` with ``data/{train,test}`` below it), and keep LEAF's natural partition: client ``i`` is the
``i``-th user of the train files, owns exactly that user's training rows (complete and disjoint), and the test
rows of every user, pooled, evaluate the global model. Users left without a training row are dropped (logged).

Sent140 (``--dataset_name sent140``)
    LEAF's ``data/sent140/preprocess/data_to_json.py``: each user's ``x`` is a list of rows ``[tweet id, date,
    query, user, text]`` (strings; ``NO_QUERY`` when there is no query) and ``y`` the polarity, 1 for Sentiment140's
    ``"4"`` (positive), else 0. Here a row keeps its five fields as columns (``tweet_id``, ``date``, ``query``,
    ``user``, ``text``), ``label`` is a ``ClassLabel`` (``negative``, ``positive``) and ``text`` is tokenized by
    ``--model_name_or_path``'s tokenizer with truncation at ``--max_seq_length``; batches are padded per batch
    (``DataCollatorWithPadding``). A user's client size is LEAF's ``num_samples`` of its train file. Any
    transformers sequence classifier trains on it (``--smoke`` writes a tiny BERT). LEAF's own LSTM
    (``models/sent140/stacked_lstm.py``: the ids of a tweet's first 25 words by LEAF's ``split_line``, an unknown
    word and the padding both id ``len(vocab)``, a trainable embedding, 2 LSTM layers of 100, the last position to
    a dense layer of 128 then 2 classes) is ``--model_name char_lstm --model_kwargs '{"embedding_dim": 100,
    "hidden_size": 100, "forget_bias": 1.0}'`` on those ids (:func:`sent140_word_ids`): the same computation
    except LEAF's two activation-free dense layers, which compose to one linear map (here the single head).
    ``forget_bias`` 1.0 is TensorFlow's ``BasicLSTMCell``: the prediction is read after the padding (up to 24 ids),
    and without it the LSTM forgets the tweet (measured: a 30-user smoke set stays at chance for 20 rounds with 0.0,
    reaches 0.95 with 1.0). Its vocabulary is the
    word list of LEAF's ``embs.json`` (GloVe's words, from ``get_embs.sh``) when one is found, else every word of
    the training tweets (:func:`sent140_vocabulary`). LEAF's bag-of-words logistic regression is not built.
Reddit (``--dataset_name reddit``)
    LEAF's ``data/reddit/source/preprocess.py`` (checked against ``TalwalkarLab/leaf``): every comment (nltk
    ``TweetTokenizer`` tokens, lower-cased) becomes input ``[<BOS>] + tokens + [<EOS>]`` and target ``tokens +
    [<EOS>, <PAD>]`` (the token after each input position), both padded with ``<PAD>`` to a multiple of
    ``SEQ_LEN`` = 10 and cut into rows of 10; ``count_tokens`` is 1 on the ``len(tokens) + 2`` real input positions,
    0 on the padding. A user's ``x`` is a list of comments, each a list of such 10-token rows; ``y`` a list of
    dicts ``{subreddit, created_utc, score, target_tokens, count_tokens}``. Comments are in time order, the first
    60% train, the next 20% ``val/`` (not read here), the last 20% test. Assumptions and choices, stated:

    * **``num_samples``** in LEAF's reddit files is copied from the file before the split (``create_leaf_json``),
      i.e. the user's total number of comments in train, val and test alike, not ``len(x)``; it is read as
      stated and not checked against ``len(x)`` (which is checked against ``len(y)``).
    * **Rows**: one dataset row per 10-token sequence (LEAF's unit of a batch, ``batch_data`` flattens the
      comments into sequences), so a client's size is its number of sequences; LEAF's ``num_train_samples``
      counts comments (the aggregation weight differs accordingly).
    * **Labels**: ``input_ids`` = vocabulary ids of ``x``, ``labels`` = ids of ``target_tokens`` with ``-100``
      where ``count_tokens`` is 0 (padding is not scored). The position whose input is ``<EOS>`` keeps its
      target ``<PAD>`` scored, as in LEAF's loss weights and accuracy denominator.
    * **Vocabulary**: LEAF's ``vocab/reddit_vocab.pck`` (``build_vocab.py``: ``{"vocab": {token: id}, "size":
      10000, "unk_symbol": 1, "pad_symbol": 0}``), looked for in ``<data_dir>/vocab/``, beside the ``train/``
      folder and one level above it (LEAF's ``data/reddit/vocab`` next to ``data/reddit/data``); read with an
      unpickler that refuses every class (the file holds only a dict of strings and ints). Without it the
      vocabulary is built from the train files exactly as ``build_vocab.py`` does (:func:`build_reddit_vocab`,
      LEAF's id assignment included: see there). An out-of-vocabulary token is ``<UNK>``.
    * **Metrics** (:func:`reddit_token_statistics` + :func:`~hf_fedflat.metrics.language_modeling.causal_lm_metrics`):
      ``eval_token_accuracy`` is LEAF's: argmax hits over the scored positions, a predicted ``<UNK>`` or
      ``<PAD>`` always wrong; ``eval_token_loss``/``eval_perplexity`` the mean cross-entropy over scored
      positions and its exp. Pooled over all test tokens (LEAF averages per client, weighted by comments).
    * **Model**: ``--model_name word_lstm`` (:mod:`hf_fedflat.models.word_lm`, LEAF's 2x256 ``stacked_lstm``);
      every 10-token row starts from a zero LSTM state (LEAF carries the state across a client's batches).
      With ``--model_name_or_path`` (a causal LM) each comment is instead rendered back to text (its tokens
      joined by spaces, without ``<BOS>``/``<EOS>``/``<PAD>``) and tokenized by the model's tokenizer at
      ``--max_seq_length``: the causal-lm path of :mod:`hf_fedflat.data.hf_datasets`, subword units, metrics
      not comparable with LEAF's word-level ones.

``--smoke`` writes a few users in these formats (:func:`write_sent140_smoke`, :func:`write_reddit_smoke`) and
loads them with the same code. ``--max_clients`` keeps a seeded draw of users (their samples are never parsed
into rows).
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import random
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch
import torch.nn.functional as F
from ..field_checks import ConfigError

__all__ = [
    "REDDIT_SEQ_LEN",
    "SENT140_LABELS",
    "RedditData",
    "RedditVocab",
    "Sent140Data",
    "build_reddit_vocab",
    "load_reddit_vocab",
    "read_reddit",
    "read_sent140",
    "reddit_comment_rows",
    "sent140_split_line",
    "sent140_vocabulary",
    "sent140_word_ids",
    "reddit_token_statistics",
    "save_reddit_vocab",
    "write_reddit_smoke",
    "write_sent140_smoke",
]

logger = logging.getLogger(__name__)

SENT140_LABELS = ["negative", "positive"]
"""Sent140's classes in LEAF's label order (``y`` = 1 for Sentiment140's polarity ``"4"``)."""
SENT140_FIELDS = ("tweet_id", "date", "query", "user", "text")
"""The five strings of a LEAF Sent140 ``x`` row, in order."""
REDDIT_SEQ_LEN = 10
"""LEAF Reddit's ``SEQ_LEN``: tokens per row."""
PAD, UNK, BOS, EOS = "<PAD>", "<UNK>", "<BOS>", "<EOS>"
IGNORE_INDEX = -100


def _max_clients_draw(max_clients: int | None, seed: int):
    """A ``keep_users`` for :func:`read_leaf`: ``max_clients`` users drawn with ``seed`` (LEAF's file order kept)."""
    if max_clients is None:
        return None
    from .leaf import choose_users

    return lambda users: choose_users(users, max_clients, seed)


# =================================================================================================
# Sent140
# =================================================================================================
@dataclass
class Sent140Data:
    """Sent140 read from LEAF's files: one row per tweet, rows grouped by user in file order.

    Attributes:
        train, test: ``datasets.Dataset`` with columns ``tweet_id``, ``date``, ``query``, ``user``, ``text``
            (strings) and ``label`` (``ClassLabel`` ``negative``/``positive``).
        users: the clients, in order (train users with at least one training tweet).
        num_samples: LEAF's ``num_samples`` of each client's train file entry (= its number of train rows).
        partition: the natural :class:`~hf_fedflat.data.partition.ClientPartition` of ``train``.
    """

    train: datasets.Dataset
    test: datasets.Dataset
    users: list[str]
    num_samples: list[int]
    partition: Any


def _sent140_rows():
    """``(user, x, y) -> columns``; errors are named with the file and user by :func:`~hf_fedflat.data.leaf.read_leaf`."""

    def convert(user: str, x: list, y: list) -> dict[str, list]:
        columns: dict[str, list] = {name: [] for name in (*SENT140_FIELDS, "label")}
        for row, label in zip(x, y):
            if not isinstance(row, list) or len(row) != len(SENT140_FIELDS):
                raise ConfigError(f"a Sent140 x row is a list of 5 strings [tweet id, date, query, user, text], got "
                                 f"{str(row)[:80]!r}")
            if isinstance(label, bool) or label not in (0, 1):
                raise ConfigError(f"a Sent140 y is 0 (negative) or 1 (positive), got {label!r}")
            for name, value in zip(SENT140_FIELDS, row):
                columns[name].append("" if value is None else str(value))
            columns["label"].append(int(label))
        return columns

    return convert


def _arrow_dataset(columns: dict[str, Any], features: datasets.Features) -> datasets.Dataset:
    """A ``Dataset`` straight from Arrow arrays (``from_dict`` encodes row by row: 9 s for 72,000 tweets)."""
    import pyarrow as pa

    table = pa.Table.from_pydict(columns, schema=features.arrow_schema)
    return datasets.Dataset(table, info=datasets.DatasetInfo(features=features))


def _sent140_dataset(per_user: dict[str, dict[str, list]], users: Sequence[str]) -> datasets.Dataset:
    features = datasets.Features({**{name: datasets.Value("string") for name in SENT140_FIELDS},
                                  "label": datasets.ClassLabel(names=SENT140_LABELS)})
    columns = {name: [v for u in users for v in per_user[u][name]] for name in (*SENT140_FIELDS, "label")}
    return _arrow_dataset(columns, features)


def read_sent140(root: str | os.PathLike, *, max_clients: int | None = None, seed: int = 0) -> Sent140Data:
    """Sent140 from LEAF's ``train/`` and ``test/`` JSON files (see the module docstring).

    Raises:
        LeafFormatError / ValueError: a malformed file or row (the file or user is named); no training tweet.
    """
    from .leaf import contiguous_partition, read_leaf

    data = read_leaf(root, _sent140_rows(), keep_users=_max_clients_draw(max_clients, seed))
    users = [u for u in data.users if u in data.train and data.train[u]["label"]]
    dropped = [u for u in data.users if u in data.train and u not in users]
    if dropped:
        logger.info("sent140: %d users without a training tweet dropped (e.g. %s)", len(dropped), dropped[:3])
    if not users:
        raise ConfigError(f"data_dir={str(root)!r}: no Sent140 user has a training tweet.")
    train = _sent140_dataset(data.train, users)
    test_users = [u for u in data.users if u in data.test]
    test = _sent140_dataset(data.test, test_users)
    sizes = [len(data.train[u]["label"]) for u in users]
    labels = np.fromiter((v for u in users for v in data.train[u]["label"]), dtype=np.int64, count=sum(sizes))
    partition = contiguous_partition(sizes, labels, SENT140_LABELS)
    return Sent140Data(train=train, test=test, users=users, num_samples=[data.num_samples["train"][u] for u in users],
                       partition=partition)


SENT140_MAX_WORDS = 25
"""Words per tweet of LEAF's Sent140 LSTM (``process_x(..., max_words=25)``; ``baseline_constants``' seq_len)."""
_SPLIT_LINE = re.compile(r"[\w']+|[.,!?;]")


def sent140_split_line(line: str) -> list[str]:
    """LEAF's ``split_line``: words (letters, digits, ``_``, ``'``) and the marks ``. , ! ? ;``."""
    return _SPLIT_LINE.findall(line)


def sent140_word_ids(line: str, word2id: dict[str, int], max_words: int = SENT140_MAX_WORDS) -> list[int]:
    """LEAF's ``line_to_indices``: the first ``max_words`` words' ids, an unknown word and the padding after the
    last word both ``len(word2id)``; always ``max_words`` ids."""
    unk = len(word2id)
    ids = [word2id.get(w, unk) for w in sent140_split_line(line)[:max_words]]
    return ids + [unk] * (max_words - len(ids))


def _find_sent140_embs(root: str | os.PathLike, leaf_root: Path) -> Path | None:
    """LEAF's ``embs.json`` (``models/sent140/get_embs.sh``): in ``data_dir``, beside or above LEAF's data folder,
    or in LEAF's ``models/sent140/`` of the same checkout."""
    candidates = [Path(root).expanduser(), leaf_root, leaf_root.parent]
    if len(leaf_root.parents) >= 3:
        candidates.append(leaf_root.parents[2] / "models" / "sent140")
    return next((folder / "embs.json" for folder in candidates if (folder / "embs.json").is_file()), None)


def sent140_vocabulary(root: str | os.PathLike, texts: Sequence[str]) -> tuple[dict[str, int], str]:
    """``(word -> id, where it came from)``: the ``vocab`` list of LEAF's ``embs.json`` (GloVe's words, id = position)
    when one is found (see :func:`_find_sent140_embs`), else every word of ``texts`` (the training tweets) by
    decreasing count, ties by word."""
    from .leaf import resolve_leaf_root

    found = _find_sent140_embs(root, resolve_leaf_root(root))
    if found is not None:
        vocab = json.loads(found.read_text(encoding="utf-8")).get("vocab")
        if not isinstance(vocab, list) or not vocab:
            raise ConfigError(f"{found}: LEAF's embs.json holds a 'vocab' list of words (and 'emba'), got "
                             f"{type(vocab).__name__}")
        return {str(w): i for i, w in enumerate(vocab)}, str(found)
    counts = Counter(w for text in texts for w in sent140_split_line(text))
    words = sorted(counts, key=lambda w: (-counts[w], w))
    return {w: i for i, w in enumerate(words)}, "the training tweets"


# =================================================================================================
# Reddit
# =================================================================================================
@dataclass
class RedditVocab:
    """LEAF Reddit's vocabulary (the content of ``reddit_vocab.pck``): ``token -> id`` in ``[0, size)``."""

    vocab: dict[str, int]
    size: int = 10000
    unk_symbol: int = 1
    pad_symbol: int = 0

    def ids(self, tokens: Sequence[str]) -> list[int]:
        """Ids of ``tokens``; a token outside the vocabulary is ``unk_symbol`` (LEAF's ``defaultdict``)."""
        get = self.vocab.get
        return [get(t, self.unk_symbol) for t in tokens]

    def to_dict(self) -> dict[str, Any]:
        return {"vocab": dict(self.vocab), "size": self.size, "unk_symbol": self.unk_symbol,
                "pad_symbol": self.pad_symbol}


def build_reddit_vocab(counter: Counter, vocab_size: int = 10000) -> RedditVocab:
    """LEAF's ``build_vocab.py``: ``<PAD>`` = 0, ``<UNK>`` = 1, then tokens by decreasing count (ties by token),
    the ``i``-th (from 0) getting id ``i + 1``, ``<PAD>`` skipped, ``vocab_size - 2`` tokens at most.

    Reproduced as LEAF writes it, so ids match a ``reddit_vocab.pck`` made by LEAF: when ``<PAD>`` is not the
    most frequent token (it usually is: LEAF counts the padding of ``x``), the most frequent token also gets id 1,
    the id of ``<UNK>``.
    """
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 3:
        raise ConfigError(f"vocab_size must be an integer >= 3, got {vocab_size!r}")
    pairs = sorted(counter.items(), key=lambda item: (-item[1], item[0]))[: vocab_size - 2]
    vocab = {PAD: 0, UNK: 1}
    for i, (token, _) in enumerate(pairs):
        if token != PAD:
            vocab[token] = i + 1
    return RedditVocab(vocab=vocab, size=vocab_size, unk_symbol=1, pad_symbol=0)


class _NoClassUnpickler(pickle.Unpickler):
    """Reads a pickle of plain dicts, lists, strings and numbers; refuses to import anything."""

    def find_class(self, module: str, name: str):
        raise pickle.UnpicklingError(f"reddit_vocab.pck refers to {module}.{name}; a LEAF vocabulary holds only a "
                                     "dict of strings and integers")


def load_reddit_vocab(path: str | os.PathLike) -> RedditVocab:
    """LEAF's ``reddit_vocab.pck`` (or the same dict as ``.json``), checked: ids in ``[0, size)``."""
    path = Path(path)
    try:
        if path.suffix == ".json":
            content = json.loads(path.read_text(encoding="utf-8"))
        else:
            with open(path, "rb") as handle:
                content = _NoClassUnpickler(handle).load()
    except (pickle.UnpicklingError, json.JSONDecodeError, EOFError) as error:
        raise ConfigError(f"{path}: not a LEAF reddit vocabulary ({error})") from error
    if not isinstance(content, dict) or not {"vocab", "size", "unk_symbol", "pad_symbol"} <= set(content):
        raise ConfigError(f"{path}: a LEAF reddit vocabulary is a dict with vocab, size, unk_symbol, pad_symbol")
    vocab = {str(k): int(v) for k, v in content["vocab"].items()}
    size = int(content["size"])
    bad = [k for k, v in vocab.items() if not 0 <= v < size]
    if bad:
        raise ConfigError(f"{path}: token {bad[0]!r} has id {vocab[bad[0]]}, outside [0, size={size})")
    return RedditVocab(vocab=vocab, size=size, unk_symbol=int(content["unk_symbol"]),
                       pad_symbol=int(content["pad_symbol"]))


def save_reddit_vocab(vocab: RedditVocab, path: str | os.PathLike) -> Path:
    """Write ``vocab`` as LEAF does (a pickled dict; ``.json`` for a JSON file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".json":
        path.write_text(json.dumps(vocab.to_dict()), encoding="utf-8")
    else:
        with open(path, "wb") as handle:
            pickle.dump(vocab.to_dict(), handle)
    return path


def _find_vocab(root: str | os.PathLike, leaf_root: Path) -> Path | None:
    given = Path(root).expanduser()
    for folder in (given / "vocab", leaf_root / "vocab", leaf_root.parent / "vocab"):
        for name in ("reddit_vocab.pck", "reddit_vocab.json"):
            if (folder / name).is_file():
                return folder / name
    return None


def reddit_comment_rows(tokens: Sequence[str], seq_len: int = REDDIT_SEQ_LEN) -> tuple[list, list, list]:
    """LEAF's ``create_seqs`` for one comment: ``(x rows, target_tokens rows, count_tokens rows)``.

    ``x`` = ``[<BOS>] + tokens + [<EOS>]``, target = ``tokens + [<EOS>, <PAD>]``, count = 1 on the real input
    positions; each padded with ``<PAD>`` (count 0) to a multiple of ``seq_len`` and cut into rows.
    """
    x = [BOS, *tokens, EOS]
    t = [*tokens, EOS, PAD]
    count = [1.0] * len(x)
    pad = (-len(x)) % seq_len
    x, t, count = x + [PAD] * pad, t + [PAD] * pad, count + [0.0] * pad
    rows = range(0, len(x), seq_len)
    return [x[i:i + seq_len] for i in rows], [t[i:i + seq_len] for i in rows], [count[i:i + seq_len] for i in rows]


def _comment_text(comment: list) -> str:
    """The words of one LEAF comment (its rows of input tokens) without ``<BOS>``/``<EOS>``/``<PAD>``."""
    words = []
    for row in comment:
        for token in row:
            if token == EOS:
                return " ".join(words)
            if token not in (BOS, PAD):
                words.append(str(token))
    return " ".join(words)


@dataclass
class RedditData:
    """Reddit read from LEAF's files.

    Attributes:
        train, test: ``datasets.Dataset``; for the word-level model ``input_ids``/``labels`` (``seq_len`` ids
            each, labels ``-100`` where not scored), else (``text=True``) one row per comment, column ``text``.
        users: the clients in order (train users with at least one row).
        sizes: each client's number of train rows (sequences, or comments with ``text=True``).
        comments: each client's number of train comments (``len(x)`` of its train entry).
        num_samples: LEAF's stated ``num_samples`` of each client (its total comment count, see the module doc).
        vocab: the vocabulary (``None`` with ``text=True``).
        seq_len: tokens per row (LEAF: 10).
        partition: the natural partition of ``train``.
    """

    train: datasets.Dataset
    test: datasets.Dataset
    users: list[str]
    sizes: list[int]
    comments: list[int]
    num_samples: list[int]
    vocab: RedditVocab | None
    seq_len: int
    partition: Any = None
    vocab_path: str | None = field(default=None)


def _reddit_targets(y: list) -> list[tuple[list, list]]:
    out = []
    for meta in y:
        if not isinstance(meta, dict) or "target_tokens" not in meta or "count_tokens" not in meta:
            raise ConfigError(f"a Reddit y entry is a dict with target_tokens and count_tokens (LEAF's preprocess.py), "
                             f"got {str(meta)[:80]!r}")
        out.append((meta["target_tokens"], meta["count_tokens"]))
    return out


def _reddit_id_converter(vocab: RedditVocab):
    """``(user, x, y) -> (input_ids [rows, seq_len] int32, labels [rows, seq_len] int32, comments)``; errors are
    named with the file and user by :func:`~hf_fedflat.data.leaf.read_leaf`."""
    from itertools import repeat

    get, unk = vocab.vocab.get, vocab.unk_symbol

    def convert(user: str, x: list, y: list) -> tuple[np.ndarray, np.ndarray, int]:
        inputs: list[str] = []
        targets: list[str] = []
        counts: list[float] = []
        widths = set()
        for comment, (target_rows, count_rows) in zip(x, _reddit_targets(y)):
            if not (len(comment) == len(target_rows) == len(count_rows)):
                raise ConfigError(f"a comment has {len(comment)} input rows, {len(target_rows)} target rows and "
                                 f"{len(count_rows)} count rows (must be equal)")
            for row, target, count in zip(comment, target_rows, count_rows):
                if not (len(row) == len(target) == len(count)):
                    raise ConfigError(f"rows of unequal length (x {len(row)}, target_tokens {len(target)}, count_tokens "
                                     f"{len(count)})")
                widths.add(len(row))
                inputs += row
                targets += target
                counts += count
        if len(widths) > 1:
            raise ConfigError(f"rows of lengths {sorted(widths)}; LEAF's rows all have SEQ_LEN tokens")
        width = widths.pop() if widths else REDDIT_SEQ_LEN
        ids = np.fromiter(map(get, inputs, repeat(unk)), dtype=np.int32, count=len(inputs)).reshape(-1, width)
        labels = np.fromiter(map(get, targets, repeat(unk)), dtype=np.int32, count=len(targets)).reshape(-1, width)
        labels[np.asarray(counts, dtype=np.float64).reshape(-1, width) == 0] = IGNORE_INDEX
        return ids, labels, len(x)

    return convert


def _reddit_text_converter():
    def convert(user: str, x: list, y: list) -> tuple[list[str], None, int]:
        _reddit_targets(y)
        return [_comment_text(comment) for comment in x], None, len(x)

    return convert


def _count_train_tokens(leaf_root: Path, keep) -> Counter:
    """LEAF's ``build_counter``: every token of every train ``x`` row (padding included)."""
    from .leaf import iter_leaf_users, leaf_split_files

    counter: Counter = Counter()
    users = None
    if keep is not None:
        from .leaf import _load_file  # noqa: PLC2701 - the cheap user pass read_leaf also makes

        users = set(keep([str(u) for p in leaf_split_files(leaf_root, "train") for u in _load_file(p)["users"]]))
    for item in iter_leaf_users(leaf_root, "train", check_num_samples=False):
        if users is not None and item.user not in users:
            continue
        for comment in item.x:
            for row in comment:
                counter.update(row)
    return counter


def read_reddit(root: str | os.PathLike, *, text: bool = False, vocab_size: int = 10000,
                max_clients: int | None = None, seed: int = 0) -> RedditData:
    """Reddit from LEAF's ``train/`` and ``test/`` JSON files (see the module docstring).

    Args:
        root: the LEAF folder (``train/``, ``test/``; or ``data/reddit`` with ``data/`` below).
        text: one row per comment as text (for a transformers tokenizer) instead of vocabulary ids.
        vocab_size: size of the vocabulary built from train when no ``reddit_vocab.pck`` is found (LEAF: 10,000).
        max_clients, seed: keep a seeded draw of ``max_clients`` users.

    Raises:
        LeafFormatError / ValueError: a malformed file, user or row (named); no user with a training row.
    """
    from .leaf import contiguous_partition, read_leaf, resolve_leaf_root

    leaf_root = resolve_leaf_root(root)
    keep = _max_clients_draw(max_clients, seed)
    vocab, vocab_path = None, None
    if text:
        convert = _reddit_text_converter()
    else:
        found = _find_vocab(root, leaf_root)
        if found is not None:
            vocab, vocab_path = load_reddit_vocab(found), str(found)
            logger.info("reddit: vocabulary of %d ids from %s", vocab.size, found)
        else:
            vocab = build_reddit_vocab(_count_train_tokens(leaf_root, keep), vocab_size)
            logger.info("reddit: no vocab/reddit_vocab.pck found; vocabulary of %d ids built from the train files as "
                        "LEAF's build_vocab.py does", vocab.size)
        convert = _reddit_id_converter(vocab)
    data = read_leaf(leaf_root, convert, keep_users=keep, check_num_samples=False)
    users = [u for u in data.users if u in data.train and len(data.train[u][0])]
    dropped = [u for u in data.users if u in data.train and u not in users]
    if dropped:
        logger.info("reddit: %d users without a training row dropped (e.g. %s)", len(dropped), dropped[:3])
    if not users:
        raise ConfigError(f"data_dir={str(root)!r}: no Reddit user has a training comment.")
    test_users = [u for u in data.users if u in data.test and len(data.test[u][0])]

    def build(per_user: dict, names: list[str]) -> datasets.Dataset:
        if text:
            return _arrow_dataset({"text": [t for u in names for t in per_user[u][0]]},
                                  datasets.Features({"text": datasets.Value("string")}))
        import pyarrow as pa

        width = per_user[names[0]][0].shape[1] if names else REDDIT_SEQ_LEN
        inputs = np.concatenate([per_user[u][0] for u in names]) if names else np.zeros((0, width), np.int32)
        labels = np.concatenate([per_user[u][1] for u in names]) if names else np.zeros((0, width), np.int32)
        sequence = datasets.Sequence(datasets.Value("int32"), length=width)
        rows = {k: pa.FixedSizeListArray.from_arrays(pa.array(v.reshape(-1)), width)
                for k, v in (("input_ids", inputs), ("labels", labels))}
        return _arrow_dataset(rows, datasets.Features({"input_ids": sequence, "labels": sequence}))

    train, test = build(data.train, users), build(data.test, test_users)
    if not text and len(test) and train.features["input_ids"].length != test.features["input_ids"].length:
        raise ConfigError(f"data_dir={str(root)!r}: train rows have {train.features['input_ids'].length} tokens, "
                         f"test rows {test.features['input_ids'].length}")
    sizes = [len(data.train[u][0]) for u in users]
    seq_len = REDDIT_SEQ_LEN if text else int(train.features["input_ids"].length)
    return RedditData(train=train, test=test, users=users, sizes=sizes, comments=[data.train[u][2] for u in users],
                      num_samples=[data.num_samples["train"][u] for u in users], vocab=vocab, seq_len=seq_len,
                      partition=contiguous_partition(sizes, None, ["all"]), vocab_path=vocab_path)


def reddit_token_statistics(logits: Any, labels: torch.Tensor, *, pad_id: int = 0, unk_id: int = 1) -> torch.Tensor:
    """``[batch, 3]`` per row: summed NLL of the scored positions, their count, and LEAF's hits (argmax == label,
    a predicted ``<PAD>`` or ``<UNK>`` never a hit). Position ``t``'s label is predicted from the logits at ``t``
    (the targets are already shifted in LEAF's data); ``-100`` is not scored. Rows of this feed
    :func:`~hf_fedflat.metrics.language_modeling.causal_lm_metrics` (the Trainer's ``preprocess_logits_for_metrics``).
    """
    if isinstance(logits, (tuple, list)):
        logits = logits[0]
    logits = logits.float()
    labels = labels.to(logits.device)
    mask = labels != IGNORE_INDEX
    safe = labels.masked_fill(~mask, 0).long()
    nll = F.cross_entropy(logits.reshape(-1, logits.size(-1)), safe.reshape(-1), reduction="none").view_as(safe) * mask
    predicted = logits.argmax(dim=-1)
    hits = (predicted == safe) & mask & (predicted != pad_id) & (predicted != unk_id)
    return torch.stack([nll.sum(dim=1), mask.sum(dim=1).float(), hits.sum(dim=1).float()], dim=1)


# =================================================================================================
# --smoke: tiny data in LEAF's formats
# =================================================================================================
_TWEET_POSITIVE = ("love", "great", "happy", "awesome", "good", "fun", "thanks", "nice")
_TWEET_NEGATIVE = ("hate", "sad", "awful", "bad", "tired", "sick", "miss", "sucks")
_TWEET_NEUTRAL = ("today", "the", "work", "my", "day", "is", "so", "this", "morning", "i", "and", "again", "lol")
_REDDIT_WORDS = ("the", "i", "a", "is", "it", "to", "game", "this", "that", "was", "you", "and", "of", "like", "just",
                 "team", "season", "play", "good", "think", "!", ".", "?", "<URL>", "<USER>")


def sent140_smoke_words() -> list[str]:
    """Every word the Sent140 smoke tweets use (a tokenizer trained on these covers them)."""
    return [*_TWEET_POSITIVE, *_TWEET_NEGATIVE, *_TWEET_NEUTRAL, "@user", "!"]


def sent140_smoke_rows(user: str, n: int, rng: random.Random, start_id: int) -> tuple[list, list]:
    """``n`` LEAF Sent140 ``(x, y)`` samples of ``user``: the label carried by 1-2 cue words among neutral ones."""
    xs, ys = [], []
    for i in range(n):
        positive = rng.random() < 0.5
        words = [rng.choice(_TWEET_NEUTRAL) for _ in range(rng.randint(3, 6))]
        for _ in range(rng.randint(1, 2)):
            words.insert(rng.randrange(len(words) + 1), rng.choice(_TWEET_POSITIVE if positive else _TWEET_NEGATIVE))
        day = 6 + (start_id + i) % 20
        date = f"Mon Apr {day:02d} {(start_id + i) % 24:02d}:{i % 60:02d}:45 PDT 2009"
        xs.append([str(1467810000 + start_id + i), date, "NO_QUERY", user, " ".join(words)])
        ys.append(1 if positive else 0)
    return xs, ys


def write_sent140_smoke(root: str | os.PathLike, *, num_users: int = 6, seed: int = 0) -> Path:
    """A few Twitter users in LEAF Sent140's files (``train/``, ``test/``; by-sample split, 10-18 tweets each,
    about 1 in 5 for test); returns ``root``."""
    from .leaf import write_leaf

    rng = random.Random(seed)
    train, test = {}, {}
    next_id = 0
    for u in range(num_users):
        user = f"smoke_tweeter_{u}"
        n = rng.randint(10, 18)
        x, y = sent140_smoke_rows(user, n, rng, next_id)
        next_id += n
        cut = max(1, int(0.8 * n))
        train[user], test[user] = (x[:cut], y[:cut]), (x[cut:], y[cut:])
    write_leaf(root, "train", train, num_files=2, prefix="all_data_niid_05_keep_10")
    write_leaf(root, "test", test, num_files=2, prefix="all_data_niid_05_keep_10")
    return Path(root)


def _reddit_entry(comments: list[list[str]], rng: random.Random, t0: int) -> tuple[list, list]:
    x, y = [], []
    for k, tokens in enumerate(comments):
        rows, targets, counts = reddit_comment_rows(tokens)
        x.append(rows)
        y.append({"subreddit": rng.choice(["nba", "soccer", "gaming"]), "created_utc": float(t0 + 60 * k),
                  "score": rng.randint(-3, 40), "target_tokens": targets, "count_tokens": counts})
    return x, y


def write_reddit_json(root: str | os.PathLike, split: str, users: dict[str, tuple[list, list]],
                      num_samples: dict[str, int], *, name: str = "reddit_0") -> Path:
    """One LEAF reddit file ``root/<split>/<name>_<split>.json`` with LEAF's ``num_samples`` as given (LEAF writes
    each user's total comment count in every split, see the module docstring)."""
    folder = Path(root) / split
    folder.mkdir(parents=True, exist_ok=True)
    content = {"users": list(users), "num_samples": [num_samples[u] for u in users],
               "user_data": {u: {"x": x, "y": y} for u, (x, y) in users.items()}}
    path = folder / f"{name}_{split}.json"
    path.write_text(json.dumps(content), encoding="utf-8")
    return path


def write_reddit_smoke(root: str | os.PathLike, *, num_users: int = 5, seed: int = 0, vocab_size: int = 40) -> Path:
    """A few Reddit users in LEAF's layout: ``root/data/{train,val,test}/reddit_0_<split>.json`` (comments in time
    order split 60/20/20 per user as ``preprocess.py``) and ``root/vocab/reddit_vocab.pck`` built from train as
    ``build_vocab.py`` does (``vocab_size`` ids, so some words are ``<UNK>``); returns ``root``."""
    rng = random.Random(seed)
    splits: dict[str, dict[str, tuple[list, list]]] = {"train": {}, "val": {}, "test": {}}
    totals = {}
    for u in range(num_users):
        user = str(u + 1)  # LEAF numbers reddit users "1", "2", ...
        n = rng.randint(6, 10)
        comments = [[rng.choice(_REDDIT_WORDS) for _ in range(rng.randint(2, 14))] for _ in range(n)]
        totals[user] = n
        cut_train, cut_val = int(0.6 * n), int(0.8 * n)
        for split, part in (("train", comments[:cut_train]), ("val", comments[cut_train:cut_val]),
                            ("test", comments[cut_val:])):
            splits[split][user] = _reddit_entry(part, rng, 1512086400 + 3600 * u)
    data = Path(root) / "data"
    for split, users in splits.items():
        write_reddit_json(data, split, users, totals)
    counter: Counter = Counter()
    for x, _ in splits["train"].values():
        for comment in x:
            for row in comment:
                counter.update(row)
    save_reddit_vocab(build_reddit_vocab(counter, vocab_size), Path(root) / "vocab" / "reddit_vocab.pck")
    return Path(root)


# =================================================================================================
# the catalog loaders
# =================================================================================================
def _smoke_model_dir(smoke_root: Path, architecture: str, corpus: list[str], num_labels: int = 2) -> str:
    from .tiny_text import train_word_tokenizer, write_tiny_model

    style = "bert" if architecture == "bert" else "gpt"
    tokenizer = train_word_tokenizer(style, corpus=corpus, model_max_length=128)
    return write_tiny_model(smoke_root / f"tiny_{architecture}", architecture, num_labels=num_labels, tokenizer=tokenizer)


def load_sent140_data(data_args, model_args, seed: int) -> dict[str, Any]:
    """The ``sent140`` catalog entry: :func:`read_sent140` tokenized for ``--model_name_or_path``."""
    from transformers import DataCollatorWithPadding

    from ..models.auto import load_processing_class
    from .hf_datasets import tokenize_classification

    from ..models.next_char import TEXT_MODELS

    root = data_args.data_dir or data_args.dataset_path
    leaf_model = model_args.model_name_or_path is None and model_args.model_name in TEXT_MODELS
    if data_args.smoke:
        smoke = Path(data_args.smoke_dir or "smoke_data") / "sent140"
        root = str(write_sent140_smoke(smoke, seed=seed))
        if model_args.model_name_or_path is None and not leaf_model:  # a tiny BERT that knows the smoke words
            model_args.model_name_or_path = _smoke_model_dir(smoke, "bert", [" ".join(sent140_smoke_words())])
            logger.info("sent140 --smoke: a tiny random BERT at %s", model_args.model_name_or_path)
    if root is None:
        raise ConfigError("data_dir: sent140 is read from LEAF's files; pass --data_dir with the folder holding train/ and "
                         "test/ (LEAF: data/sent140/data after ./preprocess.sh -s niid --sf 0.3 -k 30 -t sample), or "
                         "--smoke.")
    if leaf_model:
        return _sent140_word_ids_data(root, data_args, seed)
    if model_args.model_name_or_path is None:
        raise ConfigError("model_name_or_path: sent140 is text classification through a transformers model; pass "
                         "--model_name_or_path (a Hub id such as distilbert-base-uncased, or a local folder with its "
                         "tokenizer), or --model_name char_lstm for LEAF's LSTM on word ids.")
    data = read_sent140(root, max_clients=data_args.max_clients, seed=seed)
    tokenizer = load_processing_class(model_args, "text-classification")
    options = dict(text_columns=["text"], label_column="label", max_seq_length=data_args.max_seq_length)
    train = tokenize_classification(data.train, tokenizer, **options)
    test = tokenize_classification(data.test, tokenizer, **options)
    logger.info("sent140: %d users, %d training and %d test tweets", len(data.users), len(train), len(test))
    return dict(name="sent140", train=train, eval=test, num_classes=2, in_chans=0, label_column="labels", hub_id=None,
                task="text-classification", partition=data.partition, label_names=list(SENT140_LABELS),
                processing_class=tokenizer, data_collator=DataCollatorWithPadding(tokenizer))


def _sent140_word_ids_data(root: str, data_args, seed: int) -> dict[str, Any]:
    """LEAF's own Sent140 input for ``--model_name char_lstm`` (LEAF's ``sent140/stacked_lstm``): each tweet as the
    ids of its first 25 words (:func:`sent140_word_ids`), the vocabulary from ``embs.json`` or the train tweets."""
    data = read_sent140(root, max_clients=data_args.max_clients, seed=seed)
    columns = {name: split.with_format("arrow")[:] for name, split in (("train", data.train), ("test", data.test))}
    word2id, source = sent140_vocabulary(root, columns["train"].column("text").to_pylist())
    sequence = datasets.Sequence(datasets.Value("int32"), length=SENT140_MAX_WORDS)
    features = datasets.Features({"input_ids": sequence, "labels": datasets.ClassLabel(names=SENT140_LABELS)})

    def encode(table) -> datasets.Dataset:  # column reads from Arrow (a Dataset column iterates row by row)
        ids = [sent140_word_ids(text, word2id) for text in table.column("text").to_pylist()]
        labels = table.column("label").to_pylist()
        return _arrow_dataset({"input_ids": ids, "labels": labels}, features).with_format("torch")

    logger.info("sent140: %d users, word ids of %d words from %s (unknown and padding: id %d)", len(data.users),
                len(word2id), source, len(word2id))
    return dict(name="sent140", train=encode(columns["train"]), eval=encode(columns["test"]), num_classes=2,
                in_chans=0, label_column="labels", hub_id=None, task="text-classification", partition=data.partition,
                label_names=list(SENT140_LABELS), vocab_size=len(word2id) + 1)


def load_reddit_data(data_args, model_args, seed: int) -> dict[str, Any]:
    """The ``reddit`` catalog entry: :func:`read_reddit` for ``--model_name word_lstm`` (vocabulary ids, LEAF's
    metrics) or, with ``--model_name_or_path``, comments as text for a causal LM."""
    root = data_args.data_dir or data_args.dataset_path
    if data_args.smoke:
        root = str(write_reddit_smoke(Path(data_args.smoke_dir or "smoke_data") / "reddit", seed=seed))
    if root is None:
        raise ConfigError("data_dir: reddit is read from LEAF's files; pass --data_dir with LEAF's data/reddit folder "
                         "(data/{train,test}/*.json and vocab/reddit_vocab.pck), or --smoke.")
    if model_args.model_name_or_path is None:
        if model_args.model_name != "word_lstm":
            raise ConfigError(f"model_name: reddit is next-token prediction; pass --model_name word_lstm (LEAF's "
                             f"word-level LSTM) or --model_name_or_path <causal LM>, not {model_args.model_name!r}.")
        from ..metrics.language_modeling import causal_lm_metrics

        data = read_reddit(root, max_clients=data_args.max_clients, seed=seed)
        train = data.train.with_format("torch")
        test = data.test.with_format("torch")
        logger.info("reddit: %d users, %d training and %d test rows of %d tokens, vocabulary %d", len(data.users),
                    len(train), len(test), data.seq_len, data.vocab.size)
        return dict(name="reddit", train=train, eval=test, num_classes=data.vocab.size, in_chans=0,
                    label_column="labels", hub_id=None, task="causal-lm", partition=data.partition,
                    compute_metrics=causal_lm_metrics,
                    preprocess_logits_for_metrics=partial(reddit_token_statistics, pad_id=data.vocab.pad_symbol,
                                                          unk_id=data.vocab.unk_symbol))
    from transformers import DataCollatorForSeq2Seq

    from ..metrics.language_modeling import causal_lm_metrics, token_statistics
    from ..models.auto import load_processing_class
    from .hf_datasets import tokenize_text

    from .leaf import contiguous_partition

    data = read_reddit(root, text=True, max_clients=data_args.max_clients, seed=seed)
    tokenizer = load_processing_class(model_args, "causal-lm")
    owner = np.repeat(np.arange(len(data.users)), data.sizes)
    train = tokenize_text(data.train.add_column("__client__", owner.tolist()), tokenizer, text_column="text",
                          max_seq_length=data_args.max_seq_length, keep=["__client__"])
    test = tokenize_text(data.test, tokenizer, text_column="text", max_seq_length=data_args.max_seq_length)
    # a comment that tokenizes to fewer than 2 tokens has no next token to learn and is dropped (tokenize_text)
    sizes = np.bincount(np.asarray(train["__client__"], dtype=np.int64), minlength=len(data.users))
    if len(train) != len(data.train):
        logger.info("reddit: %d training comments of fewer than 2 tokens dropped", len(data.train) - len(train))
    sizes = sizes[sizes > 0]  # rows stay grouped by user, in order: a user left with none is no client
    train = train.remove_columns("__client__")
    return dict(name="reddit", train=train, eval=test, num_classes=len(tokenizer), in_chans=0, label_column="labels",
                hub_id=None, task="causal-lm", partition=contiguous_partition(sizes.tolist(), None, ["all"]),
                processing_class=tokenizer,
                data_collator=DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=IGNORE_INDEX, padding=True),
                compute_metrics=causal_lm_metrics, preprocess_logits_for_metrics=token_statistics)
