"""LEAF Sent140 and Reddit (``hf_fedflat.data.leaf_text``): files in LEAF's JSON format written here by hand,
natural partitions, tokenization and labels computed by hand, the Reddit metrics by hand, and each ``--smoke``
end to end for 2 rounds with the run's last evaluation recomputed from the reloaded model and the raw files.
"""

from __future__ import annotations

import json
import math
import pickle
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from hf_fedflat.cli import main
from hf_fedflat.data.leaf import LeafFormatError
from hf_fedflat.data.leaf_text import (
    SENT140_LABELS,
    build_reddit_vocab,
    load_reddit_vocab,
    read_reddit,
    read_sent140,
    reddit_comment_rows,
    reddit_token_statistics,
    save_reddit_vocab,
)
from hf_fedflat.data.partition import ClientPartition

COMMON = ["--num_rounds", "2", "--clients_per_round", "2", "--local_steps", "3", "--per_device_train_batch_size", "8",
          "--use_cpu", "true", "--seed", "0", "--save_every_n_rounds", "0", "--report_to", "none"]
P = "<PAD>"


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one intra-op thread


def write_json(path: Path, users: list[str], num_samples: list[int], user_data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"users": users, "num_samples": num_samples, "user_data": user_data}))


def tweet(i: int, user: str, text: str) -> list[str]:
    return [str(1000 + i), "Mon Apr 06 22:19:45 PDT 2009", "NO_QUERY", user, text]


# ------------------------------------------------------------------------------------------ Sent140
@pytest.fixture(scope="module")
def sent140_dir(tmp_path_factory):
    """Three users over two train files (LEAF's by-sample split: every user in test too)."""
    root = tmp_path_factory.mktemp("sent140") / "data"
    a = [tweet(0, "alice", "the movie was great"), tweet(1, "alice", "bad story"), tweet(2, "alice", "good fun")]
    b = [tweet(3, "bob", "awful boring movie"), tweet(4, "bob", "i loved it")]
    c = [tweet(5, "carol", "terrible pacing"), tweet(6, "carol", "great music"), tweet(7, "carol", "a bad end"),
         tweet(8, "carol", "wonderful")]
    write_json(root / "train" / "all_data_0_train.json", ["bob", "alice"], [2, 3],
               {"bob": {"x": b, "y": [0, 1]}, "alice": {"x": a, "y": [1, 0, 1]}})
    write_json(root / "train" / "all_data_1_train.json", ["carol"], [4], {"carol": {"x": c, "y": [0, 1, 0, 1]}})
    write_json(root / "test" / "all_data_0_test.json", ["bob", "alice", "carol"], [1, 1, 1],
               {"bob": {"x": [tweet(9, "bob", "a good film")], "y": [1]},
                "alice": {"x": [tweet(10, "alice", "awful")], "y": [0]},
                "carol": {"x": [tweet(11, "carol", "great story")], "y": [1]}})
    return root


def test_sent140_one_client_per_user_complete_disjoint_sizes_are_num_samples(sent140_dir):
    data = read_sent140(sent140_dir)
    assert data.users == ["bob", "alice", "carol"]  # LEAF's file order
    assert data.num_samples == [2, 3, 4] == data.partition.num_samples
    rows = np.concatenate(data.partition.client_indices)
    np.testing.assert_array_equal(np.sort(rows), np.arange(9))  # complete and disjoint
    for client, user in enumerate(data.users):
        owned = data.train.select(data.partition.client_indices[client])
        assert set(owned["user"]) == {user}
    assert data.train["text"][:2] == ["awful boring movie", "i loved it"]
    assert data.train["label"] == [0, 1, 1, 0, 1, 0, 1, 0, 1]
    assert data.train.features["label"].names == SENT140_LABELS == ["negative", "positive"]
    assert data.partition.label_counts.tolist() == [[1, 1], [1, 2], [2, 2]]
    assert data.test["text"] == ["a good film", "awful", "great story"] and data.test["label"] == [1, 0, 1]
    assert data.train[0]["tweet_id"] == "1003" and data.train[0]["query"] == "NO_QUERY"
    two = read_sent140(sent140_dir, max_clients=2, seed=1)
    assert len(two.users) == 2 and two.users == [u for u in data.users if u in two.users]


def test_sent140_tokenized_at_max_seq_length_with_labels(sent140_dir, tmp_path):
    from helpers.hf_fixtures import tiny_bert_dir

    from hf_fedflat.data.arguments import DataArguments
    from hf_fedflat.data.leaf_text import load_sent140_data
    from hf_fedflat.models.arguments import ModelArguments

    bert = tiny_bert_dir(tmp_path / "bert")
    out = load_sent140_data(DataArguments(dataset_name="sent140", data_dir=str(sent140_dir), max_seq_length=4),
                            ModelArguments(model_name_or_path=bert), seed=0)
    vocab = out["processing_class"].get_vocab()
    ids = lambda *words: [vocab[w] for w in words]  # noqa: E731
    train = out["train"]
    # row 0 is bob's "awful boring movie": [CLS] awful boring [SEP] after truncation at 4 tokens
    assert train[0]["input_ids"] == ids("[CLS]", "awful", "boring", "[SEP]")
    assert train[1]["input_ids"] == ids("[CLS]", "i", "loved", "[SEP]")
    assert train[6]["input_ids"] == ids("[CLS]", "great", "music", "[SEP]")
    assert train["labels"] == [0, 1, 1, 0, 1, 0, 1, 0, 1]
    assert out["label_names"] == ["negative", "positive"] and out["num_classes"] == 2
    assert out["partition"].num_samples == [2, 3, 4]
    batch = out["data_collator"]([{"input_ids": train[2]["input_ids"]}, {"input_ids": ids("[CLS]", "[SEP]")}])
    assert batch["input_ids"][1].tolist() == ids("[CLS]", "[SEP]", "[PAD]", "[PAD]")  # padded per batch


def test_sent140_bad_rows_name_file_and_user(tmp_path):
    root = tmp_path / "bad"
    write_json(root / "train" / "t.json", ["u"], [1], {"u": {"x": [["1", "d", "q", "u"]], "y": [1]}})
    write_json(root / "test" / "t.json", ["u"], [1], {"u": {"x": [tweet(1, "u", "ok")], "y": [1]}})
    with pytest.raises(LeafFormatError, match=r"t\.json: user 'u'.*list of 5 strings"):
        read_sent140(root)
    write_json(root / "train" / "t.json", ["u"], [1], {"u": {"x": [tweet(0, "u", "ok")], "y": [4]}})
    with pytest.raises(LeafFormatError, match=r"user 'u'.*0 \(negative\) or 1 \(positive\), got 4"):
        read_sent140(root)


# ------------------------------------------------------------------------------------------- Reddit
def test_leaf_reddit_rows_of_one_comment_by_hand():
    x, t, c = reddit_comment_rows(["i", "like", "cats"])
    assert x == [["<BOS>", "i", "like", "cats", "<EOS>", P, P, P, P, P]]
    assert t == [["i", "like", "cats", "<EOS>", P, P, P, P, P, P]]
    assert c == [[1.0] * 5 + [0.0] * 5]
    words = [f"w{i}" for i in range(9)]  # 11 input positions: two rows, the second with one real position
    x, t, c = reddit_comment_rows(words)
    assert x == [["<BOS>", *words], ["<EOS>"] + [P] * 9]
    assert t == [[*words, "<EOS>"], [P] * 10]
    assert c == [[1.0] * 10, [1.0] + [0.0] * 9]


def test_build_vocab_is_leafs_build_vocab():
    # <PAD> the most frequent (as in LEAF's data, x is padded): ids 2, 3, ... in count order, ties by token
    counter = Counter({P: 9, "b": 3, "a": 3, "c": 2, "d": 1})
    assert build_reddit_vocab(counter, vocab_size=5).vocab == {P: 0, "<UNK>": 1, "a": 2, "b": 3}
    # LEAF's enumerate(words) with id i + 1: when <PAD> is not first, the first token shares id 1 with <UNK>
    quirk = build_reddit_vocab(Counter({"x": 5, P: 4, "y": 1}), vocab_size=10)
    assert quirk.vocab == {P: 0, "<UNK>": 1, "x": 1, "y": 3} and quirk.size == 10
    with pytest.raises(ValueError, match="vocab_size must be an integer >= 3"):
        build_reddit_vocab(counter, vocab_size=2)


def test_vocab_pickle_round_trip_and_no_classes(tmp_path):
    vocab = build_reddit_vocab(Counter({P: 3, "hi": 2}), vocab_size=6)
    path = save_reddit_vocab(vocab, tmp_path / "reddit_vocab.pck")
    with open(path, "rb") as f:  # LEAF's format: a pickled dict
        assert pickle.load(f) == {"vocab": {P: 0, "<UNK>": 1, "hi": 2}, "size": 6, "unk_symbol": 1, "pad_symbol": 0}
    assert load_reddit_vocab(path) == vocab
    evil = tmp_path / "evil.pck"
    evil.write_bytes(pickle.dumps({"vocab": {}, "size": Path("x")}))
    with pytest.raises(ValueError, match="refers to pathlib"):
        load_reddit_vocab(evil)
    bad = tmp_path / "bad.pck"
    bad.write_bytes(pickle.dumps({"vocab": {"a": 7}, "size": 5, "unk_symbol": 1, "pad_symbol": 0}))
    with pytest.raises(ValueError, match=r"'a' has id 7, outside \[0, size=5\)"):
        load_reddit_vocab(bad)


def reddit_user(comments: list[list[str]], t0: float) -> dict:
    x, y = [], []
    for k, tokens in enumerate(comments):
        rows, targets, counts = reddit_comment_rows(tokens)
        x.append(rows)
        y.append({"subreddit": "nba", "created_utc": t0 + k, "score": 1, "target_tokens": targets, "count_tokens": counts})
    return {"x": x, "y": y}


@pytest.fixture(scope="module")
def reddit_dir(tmp_path_factory):
    """LEAF's layout data/reddit/{data/{train,test}, vocab}; num_samples = each user's total comments (LEAF)."""
    root = tmp_path_factory.mktemp("reddit") / "reddit"
    long = [f"w{i}" for i in range(9)]
    train = {"1": reddit_user([["i", "like", "cats"], long], 0), "2": reddit_user([["i", "like", "dogs"]], 10)}
    test = {"1": reddit_user([["like", "i"]], 5), "2": reddit_user([["dogs"]], 15)}
    totals = [4, 3]  # LEAF: the total comments of each user (train + val + test), not len(x)
    for split, users in (("train", train), ("test", test)):
        write_json(root / "data" / split / f"reddit_0_{split}.json", ["1", "2"], totals, users)
    vocab = {"vocab": {P: 0, "<UNK>": 1, "<BOS>": 2, "<EOS>": 3, "i": 4, "like": 5, "dogs": 6}, "size": 8,
             "unk_symbol": 1, "pad_symbol": 0}
    (root / "vocab").mkdir()
    with open(root / "vocab" / "reddit_vocab.pck", "wb") as f:
        pickle.dump(vocab, f)
    return root


def test_reddit_rows_labels_and_partition_by_hand(reddit_dir):
    data = read_reddit(reddit_dir)
    assert data.vocab.size == 8 and data.seq_len == 10
    assert data.users == ["1", "2"]
    assert data.sizes == [3, 1] == data.partition.num_samples  # 10-token rows: user 1's 2nd comment needs 2
    assert data.comments == [2, 1] and data.num_samples == [4, 3]  # len(x); LEAF's stated totals
    np.testing.assert_array_equal(np.concatenate(data.partition.client_indices), np.arange(4))
    ids = data.train.with_format("numpy")[:]
    n = -100
    # "i like cats": cats is out of the vocabulary -> <UNK> = 1; the <EOS> -> <PAD> position is scored (LEAF)
    np.testing.assert_array_equal(ids["input_ids"][0], [2, 4, 5, 1, 3, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(ids["labels"][0], [4, 5, 1, 3, 0, n, n, n, n, n])
    np.testing.assert_array_equal(ids["input_ids"][1], [2] + [1] * 9)  # w0..w8 unknown
    np.testing.assert_array_equal(ids["labels"][1], [1] * 9 + [3])
    np.testing.assert_array_equal(ids["input_ids"][2], [3] + [0] * 9)
    np.testing.assert_array_equal(ids["labels"][2], [0] + [n] * 9)
    np.testing.assert_array_equal(ids["input_ids"][3], [2, 4, 5, 6, 3, 0, 0, 0, 0, 0])  # user 2
    test = data.test.with_format("numpy")[:]
    np.testing.assert_array_equal(test["labels"], [[5, 4, 3, 0] + [n] * 6, [6, 3, 0] + [n] * 7])
    # without the pickle: LEAF's build_vocab over the train x tokens
    (reddit_dir / "vocab" / "reddit_vocab.pck").rename(reddit_dir / "vocab" / "other.pck")
    try:
        built = read_reddit(reddit_dir, vocab_size=6)
    finally:
        (reddit_dir / "vocab" / "other.pck").rename(reddit_dir / "vocab" / "reddit_vocab.pck")
    # counts: <PAD> 19, <BOS> 3, <EOS> 3, i 2, like 2, then cats/dogs/w* 1: 4 tokens kept, <PAD> skipped
    assert built.vocab.vocab == {P: 0, "<UNK>": 1, "<BOS>": 2, "<EOS>": 3, "i": 4}
    assert built.train.with_format("numpy")[:]["input_ids"][0].tolist() == [2, 4, 1, 1, 3, 0, 0, 0, 0, 0]


def test_reddit_token_statistics_by_hand():
    logits = torch.log(torch.tensor([[[0.1, 0.2, 0.7], [0.5, 0.3, 0.2], [0.2, 0.6, 0.2], [0.3, 0.3, 0.4]]]))
    labels = torch.tensor([[2, 0, 1, -100]])
    stats = reddit_token_statistics(logits, labels, pad_id=0, unk_id=1)
    nll = -(math.log(0.7) + math.log(0.5) + math.log(0.6))
    # position 0: argmax 2 == label (hit); 1: argmax 0 = <PAD>, never a hit; 2: argmax 1 = <UNK>, never a hit
    assert stats.tolist()[0][1:] == [3.0, 1.0]
    assert stats[0, 0].item() == pytest.approx(nll, rel=1e-6)


def test_reddit_needs_a_language_model(reddit_dir):
    from hf_fedflat.data.arguments import DataArguments
    from hf_fedflat.data.leaf_text import load_reddit_data
    from hf_fedflat.models.arguments import ModelArguments

    with pytest.raises(ValueError, match="model_name: reddit is next-token prediction; pass --model_name word_lstm"):
        load_reddit_data(DataArguments(dataset_name="reddit", data_dir=str(reddit_dir)), ModelArguments(), seed=0)
    with pytest.raises(ValueError, match="data_dir: reddit is read from LEAF's files"):
        load_reddit_data(DataArguments(dataset_name="reddit"), ModelArguments(model_name="word_lstm"), seed=0)


# ------------------------------------------------------------------------------------ --smoke runs
def test_sent140_smoke_two_rounds_recomputed(tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    assert main(["train", "--dataset_name", "sent140", "--smoke", "--output_dir", str(tmp_path), "--optim",
                 "adamw_torch", "--learning_rate", "0.01", "--max_seq_length", "12", *COMMON]) == 0
    history = json.loads((tmp_path / "history.json").read_text())
    assert len(history) == 2
    leaf = tmp_path / "smoke_data" / "sent140"
    train_files = sorted((leaf / "train").glob("*.json"))
    users, sizes = [], []
    for path in train_files:  # LEAF's files as written, read here without the loader
        content = json.loads(path.read_text())
        users += content["users"]
        sizes += content["num_samples"]
    part = ClientPartition.load_json(tmp_path / "partition.json")
    assert part.num_clients == len(users) == 6 and part.num_samples == sizes
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "final_model").eval()
    assert model.config.id2label == {0: "negative", 1: "positive"}
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "final_model")
    texts, labels = [], []
    for path in sorted((leaf / "test").glob("*.json")):
        for user, rows in json.loads(path.read_text())["user_data"].items():
            texts += [row[4] for row in rows["x"]]
            labels += rows["y"]
    with torch.no_grad():
        batch = tokenizer(texts, truncation=True, max_length=12, padding=True, return_tensors="pt")
        predicted = model(**batch).logits.argmax(-1).numpy()
    assert history[-1]["eval_accuracy"] == pytest.approx(float(np.mean(predicted == np.array(labels))), abs=1e-9)


def test_reddit_smoke_word_lstm_two_rounds_leaf_metrics_recomputed(tmp_path):
    from hf_fedflat.models import load_model

    kwargs = json.dumps({"embedding_dim": 16, "hidden_size": 16, "num_layers": 2})
    assert main(["train", "--dataset_name", "reddit", "--smoke", "--model_name", "word_lstm", "--model_kwargs", kwargs,
                 "--output_dir", str(tmp_path), "--optim", "adamw_torch", "--learning_rate", "0.01", *COMMON]) == 0
    last = json.loads((tmp_path / "history.json").read_text())[-1]
    root = tmp_path / "smoke_data" / "reddit"
    with open(root / "vocab" / "reddit_vocab.pck", "rb") as f:
        vocab = pickle.load(f)
    ids = lambda row: [vocab["vocab"].get(t, vocab["unk_symbol"]) for t in row]  # noqa: E731
    train = json.loads(next((root / "data" / "train").glob("*.json")).read_text())
    part = ClientPartition.load_json(tmp_path / "partition.json")
    assert part.num_clients == len(train["users"]) == 5
    assert part.num_samples == [sum(len(c) for c in train["user_data"][u]["x"]) for u in train["users"]]
    model = load_model(tmp_path / "final_model").eval()
    assert model.config.vocab_size == vocab["size"] == 40
    nll = tokens = hits = 0.0
    test = json.loads(next((root / "data" / "test").glob("*.json")).read_text())
    for user in test["users"]:
        for comment, meta in zip(test["user_data"][user]["x"], test["user_data"][user]["y"]):
            for row, target, count in zip(comment, meta["target_tokens"], meta["count_tokens"]):
                with torch.no_grad():
                    logp = torch.log_softmax(model(torch.tensor([ids(row)])).logits[0].double(), -1)
                for t, (label, c) in enumerate(zip(ids(target), count)):
                    if c:
                        nll -= float(logp[t, label])
                        tokens += 1
                        guess = int(logp[t].argmax())
                        hits += guess == label and guess not in (vocab["pad_symbol"], vocab["unk_symbol"])
    assert last["eval_tokens"] == tokens
    assert last["eval_token_loss"] == pytest.approx(nll / tokens, rel=1e-5)
    assert last["eval_perplexity"] == pytest.approx(math.exp(nll / tokens), rel=1e-5)
    assert last["eval_token_accuracy"] == pytest.approx(hits / tokens, abs=1e-9)


def test_reddit_comments_as_text_for_a_causal_lm(reddit_dir, tmp_path):
    from hf_fedflat.data.arguments import DataArguments
    from hf_fedflat.data.leaf_text import load_reddit_data
    from hf_fedflat.data.tiny_text import train_word_tokenizer, write_tiny_model
    from hf_fedflat.models.arguments import ModelArguments

    tokenizer = train_word_tokenizer("gpt", corpus=["i like dogs w0 w1 w2"])
    gpt2 = write_tiny_model(tmp_path / "gpt2", "gpt2", tokenizer=tokenizer)
    out = load_reddit_data(DataArguments(dataset_name="reddit", data_dir=str(reddit_dir), max_seq_length=6),
                           ModelArguments(model_name_or_path=gpt2), seed=0)
    vocab = out["processing_class"].get_vocab()
    ids = lambda *words: [vocab.get(w, vocab["<unk>"]) for w in words]  # noqa: E731
    train = out["train"]
    # one row per comment, <BOS>/<EOS>/<PAD> dropped, the tokenizer's EOS appended, cut at 6 tokens; labels = inputs
    assert train["input_ids"] == [ids("i", "like", "cats", "<eos>"), ids("w0", "w1", "w2", "w3", "w4", "w5"),
                                  ids("i", "like", "dogs", "<eos>")]
    assert train["labels"] == train["input_ids"]
    assert out["partition"].num_samples == [2, 1] and out["task"] == "causal-lm"
    assert out["eval"]["input_ids"] == [ids("like", "i", "<eos>"), ids("dogs", "<eos>")]
    assert main(["train", "--dataset_name", "reddit", "--data_dir", str(reddit_dir), "--model_name_or_path", gpt2,
                 "--output_dir", str(tmp_path / "run"), "--optim", "adamw_torch", "--learning_rate", "0.01",
                 *COMMON]) == 0
    last = json.loads((tmp_path / "run" / "history.json").read_text())[-1]
    assert last["eval_tokens"] == 3  # "like i <eos>" scores 2 next tokens, "dogs <eos>" 1
    assert math.isfinite(last["eval_perplexity"])


def test_sent140_leaf_word_ids_for_leafs_lstm(sent140_dir, tmp_path):
    from hf_fedflat.data.arguments import DataArguments
    from hf_fedflat.data.leaf_text import load_sent140_data, sent140_split_line, sent140_word_ids
    from hf_fedflat.models.arguments import ModelArguments

    assert sent140_split_line("I loved it, don't_go!! 2day") == ["I", "loved", "it", ",", "don't_go", "!", "!", "2day"]
    word2id = {"a": 0, "good": 1}
    assert sent140_word_ids("a good, good day", word2id, max_words=6) == [0, 1, 2, 1, 2, 2]  # ',' 'day' unknown
    assert sent140_word_ids("a a a a", word2id, max_words=3) == [0, 0, 0]
    args = DataArguments(dataset_name="sent140", data_dir=str(sent140_dir))
    out = load_sent140_data(args, ModelArguments(model_name="char_lstm"), seed=0)
    # built from the 9 train tweets: 'bad' 2, 'great' 2, 'movie' 2, then the 1-count words alphabetically
    words = ["bad", "great", "movie", "a", "awful", "boring", "end", "fun", "good", "i", "it", "loved", "music",
             "pacing", "story", "terrible", "the", "was", "wonderful"]
    unk = len(words)
    assert out["vocab_size"] == unk + 1 and out["num_classes"] == 2
    first = out["train"][0]  # bob's "awful boring movie"
    assert first["input_ids"].tolist() == [4, 5, 2] + [unk] * 22 and int(first["labels"]) == 0
    assert out["eval"][0]["input_ids"].tolist()[:4] == [3, 8, unk, unk]  # "a good film": film unknown
    assert out["partition"].num_samples == [2, 3, 4]
    # LEAF's embs.json (GloVe's word list) beside the data takes precedence: id = position in its vocab
    (sent140_dir / "embs.json").write_text(json.dumps({"vocab": ["movie", "boring", "awful"], "emba": [[0.0]] * 3}))
    try:
        out = load_sent140_data(args, ModelArguments(model_name="char_lstm"), seed=0)
    finally:
        (sent140_dir / "embs.json").unlink()
    assert out["vocab_size"] == 4 and out["train"][0]["input_ids"].tolist() == [2, 1, 0] + [3] * 22
    assert main(["train", "--dataset_name", "sent140", "--data_dir", str(sent140_dir), "--model_name", "char_lstm",
                 "--model_kwargs", json.dumps({"embedding_dim": 8, "hidden_size": 8}), "--output_dir", str(tmp_path),
                 "--optim", "adamw_torch", "--learning_rate", "0.01", *COMMON]) == 0
    from hf_fedflat.models import load_model

    model = load_model(tmp_path / "final_model").eval()
    assert model.config.vocab_size == unk + 1 and model.config.num_classes == 2
    test_ids = [[3, 8] + [unk] * 23, [4] + [unk] * 24, [1, 14] + [unk] * 23]  # a good film / awful / great story
    with torch.no_grad():
        predicted = model(torch.tensor(test_ids)).logits.argmax(-1).numpy()
    accuracy = float(np.mean(predicted == np.array([1, 0, 1])))
    assert json.loads((tmp_path / "history.json").read_text())[-1]["eval_accuracy"] == pytest.approx(accuracy)
