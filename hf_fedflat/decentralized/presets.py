"""The decentralized algorithms, one registry line each (ALGORITHMS.md, "Decentralized").

Every one is ``perturbation x gossip``; the local step, sampling and gossip are shared code. Defaults
apply only to fields the user left unset.
"""

from ..algorithms.registry import AlgorithmSpec, register_preset

#: the seeds' decentralized set-up: every client trains every round (only the server baselines sample 10%)
FULL = {"decentralized_participation": "full"}

register_preset(AlgorithmSpec(
    "dfedavg", "none", (), "gossip",
    "Local SGD steps, then gossip with the neighbours.",
    "Sun et al., Decentralized Federated Averaging, IEEE TPAMI 2022",
    defaults=FULL,
))
register_preset(AlgorithmSpec(
    "dfedavgm", "none", (), "gossip",
    "Local SGD with heavy-ball momentum (reset every round), then gossip.",
    "Sun et al., Decentralized Federated Averaging, IEEE TPAMI 2022",
    # torch SGD's momentum (dampening 0) is heavy ball: b <- 0.9 b + d, w <- w - lr b. The local optimizer is
    # rebuilt for every client every round, so the momentum buffer starts from zero each round.
    defaults={"optim_args": "momentum=0.9", **FULL},
))
register_preset(AlgorithmSpec(
    "dpsgd", "none", (), "gossip",
    "One local SGD step per gossip step (adapt-then-combine D-PSGD).",
    "Lian et al., Can Decentralized Algorithms Outperform Centralized Algorithms?, NeurIPS 2017",
    # the paper: every client steps every iteration
    defaults={"local_steps": 1, **FULL},
))
register_preset(AlgorithmSpec(
    "dfedsam", "sam", (), "gossip",
    "Local SAM steps, then gossip.",
    "Shi et al., Improving the Model Consistency of Decentralized Federated Learning, ICML 2023",
    defaults={"rho": 0.05, **FULL},
))
register_preset(AlgorithmSpec(
    "dfedgam", "gam_first_order", (), "gossip",
    "Local first-order-flatness GAM steps (delta = rho*Hg/||Hg||, d = grad F(w + delta)), then gossip.",
    "DFedGAM (2025, seed paper), eq. (7)-(8) and Algorithm 1: decentralized gradient norm aware minimization",
    # the seed: every client runs its local steps every round; rho searched in {0.05, ..., 2.0} (0.1 here)
    defaults={"rho": 0.1, **FULL},
))
