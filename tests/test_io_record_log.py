"""The run's record log (``io.RecordLog``): each record encoded once, the whole list written, unforced writes
throttled and what is pending flushed."""

from __future__ import annotations


def test_record_log_encodes_each_record_once_and_writes_the_whole_list(tmp_path, monkeypatch):
    import json

    import hf_fedflat.io as io

    encoded = []
    real = io._encode_record
    monkeypatch.setattr(io, "_encode_record", lambda record: encoded.append(record["round"]) or real(record))
    path = tmp_path / "history.json"
    log, history = io.RecordLog(path), []
    for round_index in range(4):
        history.append({"round": round_index, "loss": 1.0 / (round_index + 1), "clients": [1, 2], "path": tmp_path})
        log.write(history)
        assert json.loads(path.read_text()) == json.loads(json.dumps(history, default=str))
    assert encoded == [0, 1, 2, 3]  # each record once, not the whole list every round
    assert path.read_text().count("\n") == 4 + 2  # one record per line between the brackets
    resumed = history[:2]  # a resume replaces the list: it is encoded again from its start
    log.write(resumed)
    assert json.loads(path.read_text()) == json.loads(json.dumps(resumed, default=str)) and encoded[4:] == [0, 1]
    assert not list(tmp_path.glob(".history.json.*"))  # no temporary file left behind


def test_record_log_throttles_unforced_writes_and_flushes_what_is_pending(tmp_path, monkeypatch):
    import json

    import hf_fedflat.io as io

    clock = [100.0]
    monkeypatch.setattr(io.time, "monotonic", lambda: clock[0])
    path = tmp_path / "history.json"
    log, history = io.RecordLog(path, min_interval_seconds=1.0), [{"round": 1}]
    assert log.write(history, force=False)  # the first write is never held back
    history.append({"round": 2})
    clock[0] += 0.5
    assert not log.write(history, force=False) and len(json.loads(path.read_text())) == 1
    log.flush()
    assert len(json.loads(path.read_text())) == 2
    mtime = path.stat().st_mtime_ns
    log.flush()  # nothing pending: no rewrite
    assert path.stat().st_mtime_ns == mtime
    history.append({"round": 3})
    clock[0] += 0.4  # 0.9 s after the first write, but the flush wrote at 0.5: held back
    assert not log.write(history, force=False)
    assert log.write(history, force=True) and len(json.loads(path.read_text())) == 3
    history.append({"round": 4})
    clock[0] += 1.0
    assert log.write(history, force=False) and len(json.loads(path.read_text())) == 4
