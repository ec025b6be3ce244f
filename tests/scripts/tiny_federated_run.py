"""A tiny federated run configured from the command line (used by the multi-process and kill tests).

``FEDFLAT_TEST_KILL=client:<round>`` SIGKILLs the process after the first client of that round (1-based);
``FEDFLAT_TEST_KILL=checkpoint:<round>`` SIGKILLs it halfway through writing that round's checkpoint.
"""

import os
import signal
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import HfArgumentParser  # noqa: E402

from hf_fedflat import FedTrainingArguments, FederatedCallback, FederatedTrainer, init_process_group  # noqa: E402
from hf_fedflat.federation import checkpoint  # noqa: E402

from conftest import TinyClassifier, make_tiny_dataset  # noqa: E402


def die():
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


class KillAfterFirstClient(FederatedCallback):
    def __init__(self, round_number: int):
        self.round_number = round_number

    def on_client_end(self, trainer, round_index, update, **kwargs):
        if round_index + 1 == self.round_number:
            die()


def kill_while_saving(round_number: int):
    """The checkpoint's first file is written, the rest is not: the kill lands inside save_checkpoint."""
    original = checkpoint.save_file

    def save_then_die(tensors, path, *args, **kwargs):
        original(tensors, path, *args, **kwargs)
        if f"-round-{round_number}-" in path:
            die()

    checkpoint.save_file = save_then_die


def main():
    group = init_process_group()  # before the arguments set up accelerate
    (args,) = HfArgumentParser(FedTrainingArguments).parse_args_into_dataclasses()
    callbacks = []
    kind, _, at = os.environ.get("FEDFLAT_TEST_KILL", "").partition(":")
    if kind == "client":
        callbacks.append(KillAfterFirstClient(int(at)))
    elif kind == "checkpoint":
        kill_while_saving(int(at))
    torch.manual_seed(args.seed)
    model = TinyClassifier()
    train = make_tiny_dataset(n=96, seed=1)
    test = make_tiny_dataset(n=30, seed=2)
    output = FederatedTrainer(model, args, train, test, label_column="labels", callbacks=callbacks).train()
    if group.is_main:
        save_file({"params": output.params.contiguous()}, os.path.join(args.output_dir, "final_params.safetensors"))


if __name__ == "__main__":
    main()
