"""The round loop: sample, split across processes, train, gather, apply the strategy, evaluate, record,
checkpoint. The same for server and decentralized FL; what differs is the run's
:class:`~hf_fedflat.federation.strategy.Strategy`.

Every process runs :func:`run_rounds`; the main process (rank 0) alone holds the client-state store,
aggregates, evaluates, writes ``history.json`` and checkpoints. The other processes train the clients
they are given and meet the main process at three collectives per round (the split, the round's
inputs, the gather of the results)::

    clients = strategy.sample(t)                      # seeded: the same draw on every process
    shares  = split across processes by predicted time (main decides, broadcasts)
    inputs  = strategy.send(comm, shares, t)          # w^t (or what the aggregator sends) / own models, ...
    for each of this process's clients: train from strategy.client_start(...), failure policy
    gather the updates (wire format) -> main: strategy.apply(...) -> record, eval, history, checkpoint

A round that aggregates no client (all excluded, whatever the reason, or a non-finite new state refused)
is recorded with ``num_clients: 0`` and ``round_failed``; a run that did not train, or diverged
(:mod:`.divergence`: that round is not checkpointed), raises :class:`~.outcome.TrainingFailedError` (see
:mod:`.outcome`). Between rounds (and clients) the process exits when its launcher died (:mod:`.parent`).
The run holds its folder (:mod:`.run_folder`) for all of this: ``FederatedTrainer.train`` claims it first.
"""

from __future__ import annotations

import logging
import os
import time

import numpy as np
import torch
from tqdm.auto import tqdm

from ..io import DiskFullError, RecordLog
from ..runtime.vectors import recycle_vectors
from .checkpoint import advise_resume
from .load_balance import assign_to_processes
from .outcome import FederatedTrainOutput, TrainingFailedError, untrained_reason, write_run_status
from .parent import ParentWatch
from .reporting import RoundReporter
from .strategy import NonFiniteServerStep
from .wire import decode_gathered, encode_updates

logger = logging.getLogger(__name__)

# history.json is rewritten at most this often (seconds) between eventful rounds (see RecordLog)
HISTORY_INTERVAL = 1.0


def aggregation_weights(updates, scheme: str) -> torch.Tensor:
    """``p_i``: uniform, or proportional to the clients' sample counts; summing to 1."""
    if scheme == "uniform":
        weights = torch.ones(len(updates), dtype=torch.float64)
    else:
        weights = torch.tensor([u.num_samples for u in updates], dtype=torch.float64)
    return weights / weights.sum()


def run_rounds(trainer, resume=None) -> FederatedTrainOutput:
    """Run ``args.num_rounds`` rounds of ``trainer`` (a ``FederatedTrainer``) and save the final model."""
    space = trainer.space
    # atomic, not fsynced (every checkpoint holds the history durably); after a round when a second has passed since
    # the last write, and after the first, the last and every checkpointed round (and what is pending at any exit)
    history_file = RecordLog(os.path.join(trainer.args.output_dir, "history.json"), None, HISTORY_INTERVAL)
    # model-sized vectors (weights, updates, directions) reuse their memory from client to client
    with recycle_vectors(space.numel, space.dtype, space.device):
        try:
            output = _run(trainer, resume, history_file)
        except BaseException as error:
            try:
                history_file.flush()
            except OSError as failure:  # (a full disk): the error that stopped the run is the one to report
                logger.warning("Could not write the pending history.json records: %s", failure)
            if isinstance(error, DiskFullError):  # whichever write it was: the checkpoint to resume from
                advise_resume(error, trainer.args.output_dir)
            raise
        history_file.flush()
        return output


def _run(trainer, resume, history_file) -> FederatedTrainOutput:
    args, comm, strategy = trainer.args, trainer.comm, trainer.strategy
    start_round, wall_offset = _start(trainer, resume) if comm.is_main else (0, 0.0)
    start_round = comm.broadcast_object(start_round)
    if resume and comm.is_main:  # the restored history, with the changes the resume accepted, is the run's from now
        history_file.write(trainer.history, force=True)
    reporter = RoundReporter(args, trainer.model) if comm.is_main else None
    progress = tqdm(total=args.num_rounds, initial=start_round, desc="rounds", dynamic_ncols=True,
                    disable=not comm.is_main or args.disable_tqdm)
    run_start = time.perf_counter()
    watch = ParentWatch()
    # a privacy budget (dp_target_epsilon) may allow fewer rounds: a function of the settings, the same everywhere
    last_round, stopped_because = strategy.round_limit(args.num_rounds)
    for round_index in range(start_round, last_round):
        if not comm.distributed:  # (distributed: the main process decides for all, at the end of each round)
            watch.check(f" before round {round_index + 1}")
        round_start = time.perf_counter()
        clients = strategy.sample(round_index)
        if comm.distributed and getattr(strategy, "sample_on_main", False):  # drawn from secret randomness
            clients = comm.broadcast_object(clients)
        learning_rate = strategy.learning_rate(round_index, args.learning_rate * args.lr_decay_per_round**round_index)
        trainer.call_callbacks("on_round_begin", round_index, clients)

        # where the clients train: this launch's processes, or the nodes of a federation (hf_fedflat.flower)
        updates, failures, transport = trainer.round_clients.train_round(trainer, round_index, learning_rate, clients,
                                                                         round_start, watch)
        if comm.is_main:
            trainer.failure_policy.log(round_index, failures)
            record = _apply(trainer, round_index, learning_rate, updates, failures, len(clients))
            record.update(transport)
            if failures:
                record["failed_clients"] = [{"client": c, "reason": r} for c, r in sorted(failures.items())]
            record["round_seconds"] = time.perf_counter() - round_start
            record["wall_seconds"] = wall_offset + time.perf_counter() - run_start
            record.update(trainer.diagnostics.target_metrics(record))
            trainer.history.append(record)
            diverged = trainer.divergence.check(record)
            saves = args.save_every_n_rounds and (round_index + 1) % args.save_every_n_rounds == 0 and not diverged
            history_file.write(trainer.history, force=saves or round_index in (start_round, args.num_rounds - 1))
            reporter.log(round_index + 1, {k: v for k, v in record.items() if k not in ("round", "clients")})
            progress.set_postfix({k: f"{record[k]:.4f}" for k in ("eval_accuracy", "train_loss") if k in record})
            if saves:
                trainer.checkpoints.save(round_index + 1, strategy.model(), strategy.server_state(), trainer.store,
                                         trainer.history, record["wall_seconds"])
            trainer.call_callbacks("on_round_end", round_index, record)
        progress.update(1)
        stop = (diverged or trainer.failure_policy.check(trainer.history)) if comm.is_main else None
        if comm.distributed:  # one decision for every process: the main one's (its launcher is theirs)
            stop, launcher_died = comm.broadcast_object((stop, comm.is_main and watch.parent_died()))
            if launcher_died:
                watch.stop(f" after round {round_index + 1}")
        if stop is not None:
            progress.close()
            _fail(trainer, reporter, stop)
    progress.close()
    if stopped_because is not None and comm.is_main:
        logger.warning("Stopped early: %s.", stopped_because)
        if trainer.history:
            trainer.history[-1]["run_stopped"] = stopped_because
            history_file.write(trainer.history, force=True)
    return _finish(trainer, reporter)


def _start(trainer, resume) -> tuple[int, float]:
    """Main process: the initial (or restored) state of the strategy; ``(start round, wall offset)``.

    The checkpoints carry the run's id (a resume refuses another run's; a folder without a recorded id takes the
    checkpoint's) and the divergence reference (measured on the initial model, or restored)."""
    initial = {"params": trainer.space.flatten().cpu()}
    if trainer.buffer_space is not None:
        initial["buffers"] = trainer.buffer_space.flatten().cpu()
    folder, checkpoints = trainer.run_folder, trainer.checkpoints
    checkpoints.run_id = folder.run_id if not resume or folder.info.get("run_id_from_folder") else None
    restored = None
    client_states = trainer.strategy.client_state_template(initial)  # what every client state holds in this run
    if resume:
        trainer.strategy.start(initial, None)  # the fresh server state: a checkpoint's must have its keys and shapes
        restored = checkpoints.restore(resume, trainer.store, initial["params"].dtype,
                                       server_state_template=trainer.strategy.server_state(),
                                       client_state_template=client_states)
        if checkpoints.run_id is None:
            from .run_folder import adopt_run_id

            adopt_run_id(folder, restored.run_id)
            checkpoints.run_id = restored.run_id
        trainer.history = restored.history
        trainer.divergence.reference = restored.divergence_reference
        if trainer.divergence.reference is None:  # started with the check off: the resumed run keeps the guard
            trainer.divergence.measure(trainer, initial["params"], initial.get("buffers"))
    else:
        trainer.store.clear()  # nothing of an earlier run's client states (a spilled store's folder) is used
        trainer.divergence.measure(trainer, initial["params"], initial.get("buffers"))
    checkpoints.divergence_reference = trainer.divergence.reference
    trainer.strategy.start(initial, restored)
    folder.rounds_started = True
    trainer.call_callbacks("on_train_begin")
    return (restored.round, restored.wall_seconds) if restored else (0, 0.0)


class LaunchProcesses:
    """The round's clients trained by the processes of this launch (one, or several under ``accelerate launch``):
    split by predicted time, the round's inputs broadcast (and each process's clients' states scattered), each
    process's share trained here, the results gathered to the main process.

    The round loop's one seam for where clients train: ``train_round(trainer, round_index, learning_rate, clients,
    round_start, watch) -> (updates, failures, transport)`` (on the main process the aggregatable updates in client
    order and ``{client id: why it is excluded}``; ``transport``: record fields of the exchange itself, none here).
    A federation whose clients train on other machines supplies another (``hf_fedflat.flower.FlowerClients``)."""

    def train_round(self, trainer, round_index, learning_rate, clients, round_start, watch):
        comm = trainer.comm
        shares = _split(trainer, clients)
        received = trainer.strategy.send(comm, shares, round_index)
        updates, failures = _train_share(trainer, round_index, learning_rate, shares[comm.rank], received,
                                         round_start, watch)
        gathered = comm.gather_tensors(encode_updates(updates, failures))
        if not comm.is_main:
            return None, None, {}
        updates, failures = decode_gathered(gathered)
        del gathered  # the updates alone hold the exchange buffers (reused once they are dropped)
        for update in updates:
            trainer.cost_model.observe(update.num_steps, trainer.local_work(update.client_id)[1],
                                       update.train_seconds)
        return updates, failures, {}


def _split(trainer, clients: list[int]) -> list[list[int]]:
    """The round's clients per process, decided by the main process (it holds the measured times)."""
    comm = trainer.comm
    if not comm.distributed:
        return [list(clients)]
    shares = None
    if comm.is_main:
        costs = {c: trainer.cost_model.cost(*trainer.local_work(c)) for c in clients}
        shares = assign_to_processes(clients, costs, comm.world_size)
    return comm.broadcast_object(shares)


def _train_share(trainer, round_index, learning_rate, client_ids, received, round_start, watch):
    """Train this process's clients; ``(updates, {client id: why it is excluded})``."""
    concurrent = getattr(trainer.local_training, "concurrent", None)  # concurrent_clients > 1 (federation.concurrent)
    if concurrent is not None and len(client_ids) > 1:
        return concurrent.train_share(trainer, round_index, learning_rate, client_ids, received, round_start, watch)
    args, updates, failures = trainer.args, [], {}
    for client_id in client_ids:
        if not trainer.comm.distributed:
            watch.check(f" during round {round_index + 1}")
        if args.round_deadline_seconds and time.perf_counter() - round_start > args.round_deadline_seconds:
            failures[client_id] = f"straggler: round deadline of {args.round_deadline_seconds}s passed"
            continue
        start = trainer.strategy.client_start(client_id, received)
        # through the trainer's train_client, so that a wrapper set on the trainer (a test's fault injection) runs
        update, failure = trainer.local_training.train_safely(trainer.train_client, client_id, round_index,
                                                              learning_rate, start)
        if failure is not None:
            failures[client_id] = failure
            continue
        updates.append(update)
        trainer.call_callbacks("on_client_end", round_index, update)
    return updates, failures


def _apply(trainer, round_index: int, learning_rate: float, updates, failures: dict[int, str], num_sampled: int) -> dict:
    """Main process: the strategy turns the results into the next state; the round's record.

    A round that aggregates nothing records why (``round_failed``); a refused non-finite new state moves the
    round's clients to ``failures``."""
    args, strategy = trainer.args, trainer.strategy
    record = {"round": round_index + 1, "num_clients": len(updates), "clients": [u.client_id for u in updates],
              "learning_rate": learning_rate}
    weights = aggregation_weights(updates, args.aggregation_weights) if updates else None
    if updates:  # else every client failed: the model stays as it was (decentralized: gossips unchanged)
        record["train_loss"] = float(sum(w * u.train_loss for w, u in zip(weights.tolist(), updates)))
        record["local_steps"] = float(np.mean([u.num_steps for u in updates]))
    else:
        record["round_failed"] = trainer.failure_policy.round_failure(num_sampled, failures)
    try:
        record.update(strategy.apply(round_index, learning_rate, updates, weights))
    except NonFiniteServerStep as refused:  # the strategy kept its old state: nothing was aggregated
        logger.warning("Round %d: %s", round_index + 1, refused)
        record.update(num_clients=0, clients=[], round_failed=str(refused))
        failures.update({u.client_id: f"trained, but the round was refused ({refused})" for u in updates})
        updates = []
    trainer.call_callbacks("on_aggregate", round_index, updates)
    if (round_index + 1) % args.eval_every_n_rounds == 0 or round_index + 1 == args.num_rounds:
        model = strategy.evaluation_model()  # (SWA: the averaged model, not the one training continues from)
        params, buffers = model["params"], model.get("buffers")
        if trainer.eval_generation is not None:  # greedy continuations of fixed prompts (hf_fedflat.metrics.generation)
            trainer.load_weights(params, buffers)
            record["generations"] = trainer.eval_generation(trainer.model)
        if trainer.eval_dataset is not None:
            record.update(trainer.evaluate_weights(params, buffers))
            record.update(strategy.evaluate_more(trainer.evaluate_weights))
        record.update(trainer.diagnostics.eval_metrics(trainer.client_trainer, trainer.load_weights, params,
                                                       buffers, record))
    return record


def _finish(trainer, reporter) -> FederatedTrainOutput:
    """Every process: the final model (the strategy's evaluation model); main process: saved to ``final_model/``,
    end-of-run callbacks.

    A run in which no round aggregated any client fails instead (:func:`_fail`): its model is the initial one."""
    comm, final_dir = trainer.comm, None
    untrained = comm.broadcast_object(untrained_reason(trainer.history) if comm.is_main else None)
    if untrained is not None:
        _fail(trainer, reporter, untrained)
    final = comm.broadcast_tensors(trainer.strategy.evaluation_model() if comm.is_main else None)
    params = final["params"]
    trainer.load_weights(params, final.get("buffers"))
    not_learned = None
    if comm.is_main:
        reporter.close()
        trainer.diagnostics.finish(trainer.client_trainer, params)
        trainer.learning_check = _learning_check(trainer)
        final_dir = trainer.save_model(os.path.join(trainer.args.output_dir, "final_model"))
        fields = {**trainer.run_folder.status_fields(), "learning_check": trainer.learning_check}
        if trainer.learning_check and not trainer.learning_check["learned"]:
            logger.warning("%s", trainer.learning_check["reason"])
            if getattr(trainer.args, "fail_if_not_learned", False):
                not_learned = trainer.learning_check["reason"]
        status = write_run_status(trainer.args.output_dir, trainer.history, "failed" if not_learned else "completed",
                                  not_learned, final_dir, fields)
        trainer.call_callbacks("on_train_end", trainer.history, final_model_dir=final_dir)
    not_learned = comm.broadcast_object(not_learned) if comm.distributed else not_learned
    comm.barrier()
    output = FederatedTrainOutput(params=params, history=trainer.history, final_model_dir=final_dir)
    if not_learned is not None:  # (fail_if_not_learned) the final model is kept: nothing trained is lost
        raise TrainingFailedError(not_learned, output, status if comm.is_main else None)
    return output


def _learning_check(trainer) -> dict | None:
    """:func:`~.outcome.learning_check` of the run: the majority class's share of the training rows (from the
    partition's label counts) and the initial model's loss (the divergence reference)."""
    from .outcome import learning_check

    counts = getattr(getattr(trainer, "partition", None), "label_counts", None)
    share = None
    if counts is not None and np.asarray(counts).ndim == 2 and np.asarray(counts).shape[1] > 1:
        totals = np.asarray(counts).sum(axis=0)
        share = float(totals.max() / totals.sum()) if totals.sum() > 0 else None
    reference = trainer.divergence.reference or {}
    return learning_check(trainer.history, majority_share=share, initial_loss=reference.get("initial_loss"))


def _fail(trainer, reporter, reason: str) -> None:
    """Every process: end a run that did not train. Main process: the last history record and
    ``run_status.json`` say so; then :class:`TrainingFailedError` everywhere (no ``final_model/``)."""
    comm, status = trainer.comm, {}
    final = comm.broadcast_tensors(trainer.strategy.model() if comm.is_main else None)
    if comm.is_main:
        logger.error("Training failed: %s", reason)
        reporter.close()
        if trainer.history:
            trainer.history[-1].update(run_status="failed", run_failure=reason)
            RecordLog(os.path.join(trainer.args.output_dir, "history.json")).write(trainer.history)
        status = write_run_status(trainer.args.output_dir, trainer.history, "failed", reason, None,
                                  trainer.run_folder.status_fields())
    comm.barrier()
    output = FederatedTrainOutput(params=final["params"], history=trainer.history, final_model_dir=None)
    raise TrainingFailedError(reason, output, status)
