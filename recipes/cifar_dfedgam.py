"""DFedGAM (decentralized FedGAM) on CIFAR-10 with Dirichlet label skew: the seed's set-up.

    accelerate launch recipes/cifar_dfedgam.py                                  # rho 0.1
    for rho in 0.05 0.1 0.2 0.5 1.0 2.0; do                                    # the seed's rho search
        accelerate launch recipes/cifar_dfedgam.py --rho $rho --output_dir outputs/cifar_dfedgam/rho$rho; done
    accelerate launch recipes/cifar_dfedgam.py --fed_algorithm dfedsam --topology ring
    accelerate launch recipes/cifar_dfedgam.py --fed_algorithm dpsgd
    accelerate launch recipes/cifar_dfedgam.py --hvp_mode finite_difference   # gradients only, no double backward
    accelerate launch recipes/cifar_dfedgam.py --smoke

No server: every client keeps its own model and, as in the seed ("all clients run local steps for the
decentralized methods"), all 100 run their local steps every round (``--decentralized_participation full``)
with DFedGAM's first-order flatness step (eq. 7-8: ``delta = rho * H g/||H g||`` by double backward,
``d = grad F(w + delta)``), then every client averages with its neighbours through the mixing matrix of a
random topology with at most 10 neighbours, as many as a server's clients per round (``--topology
random_regular --topology_degree 10``, re-drawn each round with ``--topology_redraw true``). SGD lr 0.1
decaying 0.995 per round, 5 local epochs of batch 50, ResNet-18-GN (the seed trains a LeNet). ``history.json`` adds the accuracy of the average
model, the mean/std of the local models' accuracies, the consensus distance and the spectral gap.
"""

from hf_fedflat.cli.recipes import run_recipe

DEFAULTS = [
    "--dataset_name", "cifar10", "--train_augmentation", "true", "--model_name", "resnet18_gn", "--image_size", "32",
    "--fed_algorithm", "dfedgam", "--rho", "0.1", "--num_clients", "100", "--participation_fraction", "0.1",
    "--decentralized_participation", "full", "--topology", "random_regular", "--topology_degree", "10",
    "--partition_scheme", "dirichlet", "--dirichlet_alpha", "0.3",
    "--optim", "sgd", "--learning_rate", "0.1", "--lr_decay_per_round", "0.995", "--local_epochs", "5",
    "--per_device_train_batch_size", "50", "--num_rounds", "500", "--eval_every_n_rounds", "5",
    "--output_dir", "outputs/cifar_dfedgam", "--save_every_n_rounds", "50",
]
SMOKE = [
    "--model_name", "small_cnn", "--num_clients", "4", "--participation_fraction", "0.5", "--min_partition_size", "1",
    "--topology_degree", "2", "--num_rounds", "2", "--local_epochs", "1", "--per_device_train_batch_size", "8",
    "--eval_every_n_rounds", "1", "--output_dir", "outputs/smoke/cifar_dfedgam", "--save_every_n_rounds", "1",
    "--overwrite_output_dir", "true",  # a smoke run's folder is scratch: running it again replaces it
    "--use_cpu", "true",
]


def main(argv=None):
    return run_recipe(argv, DEFAULTS, SMOKE)


if __name__ == "__main__":
    from hf_fedflat.cli.exit_codes import run_command_line

    run_command_line(main)
