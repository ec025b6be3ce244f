"""The named algorithms, server and decentralized, one registry line each (see docs/algorithms.md, "Presets"
and "Decentralized methods").

Any server preset also takes the aggregator plug-ins as a suffix: ``fedlesam_s+fedgh``, ``fedsam+swa``,
``fedlesam+dp``. Defaults apply only to fields
the user left unset.
"""

from .registry import AlgorithmSpec, register_preset

FEDSAM = "Qu et al., Generalized Federated Learning via Sharpness Aware Minimization, ICML 2022"
FEDLESAM = ("Fan et al., Locally Estimated Global Perturbations are Better than Local Perturbations for Federated "
            "Sharpness-aware Minimization, ICML 2024")
FEDGAM = "FedGAM / FedGAM-CV: gradient norm aware minimization in federated learning, 2024"
#: the seeds (FedGAM/-CV Alg. 1-2, FedUp Alg. 1, FedLESAM's FL-Simulator code, FedGH) average uniformly, 1/|S_t|
#: (the README's conventions table lists every preset's conventions)
UNIFORM = {"aggregation_weights": "uniform"}
#: Settings that are a paper's conventions, not any method's point: a comparison of presets gives its members one
#: value of each (hf_fedflat/cli/conventions.py) so that they differ only in their methods. A preset whose method
#: is one of them names it in ``method_fields`` (DFedAvgM's momentum). Every other preset default (rho,
#: server_learning_rate, ...) is its method's own.
CONVENTION_FIELDS = {
    "aggregation_weights": "aggregation weights p_i (by samples or uniform)",
    "scaffold_server_average": "how the server averages the control-variate updates (1/N or 1/|S_t|)",
    "decentralized_participation": "who trains each round in a decentralized run",
    "clients_per_round": "clients per round", "participation_fraction": "clients per round",
    "learning_rate": "local learning rate", "lr_decay_per_round": "learning-rate decay across rounds",
    "lr_scheduler_type": "learning-rate schedule within a round", "warmup_steps": "learning-rate warm-up",
    "weight_decay": "weight decay", "optim": "local optimizer", "optim_args": "local optimizer's arguments (momentum)",
    "local_epochs": "local work per round", "local_steps": "local work per round",
    "per_device_train_batch_size": "local batch size", "max_grad_norm": "clipping of the local step",
}

for spec in (
    # --- baselines -----------------------------------------------------------------------------------------
    AlgorithmSpec("fedavg", "none", (), "mean", "Local SGD, weighted average of the updates.",
                  "McMahan et al., Communication-Efficient Learning of Deep Networks from Decentralized Data, AISTATS 2017"),
    AlgorithmSpec("fedprox", "none", ("prox",), "mean", "Local SGD with a proximal term mu/2 ||w - w^t||^2.",
                  "Li et al., Federated Optimization in Heterogeneous Networks, MLSys 2020"),
    AlgorithmSpec("scaffold", "none", ("scaffold",), "mean", "Control variates c, c_i correct client drift.",
                  "Karimireddy et al., SCAFFOLD: Stochastic Controlled Averaging for Federated Learning, ICML 2020"),
    AlgorithmSpec("feddyn", "none", ("feddyn",), "feddyn", "Dynamic regularisation aligns local and global optima.",
                  "Acar et al., Federated Learning Based on Dynamic Regularization, ICLR 2021"),
    AlgorithmSpec("fedadam", "none", (), "fedadam", "Adam on the server over the averaged update.",
                  "Reddi et al., Adaptive Federated Optimization, ICLR 2021", defaults={"server_learning_rate": 0.1}),
    AlgorithmSpec("fednova", "none", (), "fednova", "Updates normalised by local steps before averaging.",
                  "Wang et al., Tackling the Objective Inconsistency Problem in Heterogeneous Federated Optimization, "
                  "NeurIPS 2020"),
    AlgorithmSpec("fedsam", "sam", (), "mean", "Local SAM steps, weighted average.", FEDSAM),
    AlgorithmSpec("mofedsam", "sam", ("momentum",), "mean", "Local SAM steps mixed with the last global update.", FEDSAM,
                  defaults={"momentum_first_round": "zero_momentum"}),  # the paper's Delta^0 = 0
    AlgorithmSpec("fedgamma", "sam", ("scaffold",), "mean", "SAM local steps with SCAFFOLD control variates.",
                  "Dai et al., FedGAMMA: Federated Learning With Global Sharpness-Aware Minimization, TNNLS 2023"),
    AlgorithmSpec("fedsmoo", "smoo", ("feddyn",), "fedsmoo",
                  "SAM with a perturbation corrected towards the global one, plus FedDyn.",
                  "Sun et al., Dynamic Regularized Sharpness Aware Minimization in Federated Learning, ICML 2023"),
    # --- seeds -----------------------------------------------------------------------------------------------
    AlgorithmSpec("fedlesam", "lesam", (), "mean",
                  "SAM with the global perturbation estimated from the change of the global model; one pass per step.",
                  FEDLESAM, defaults=UNIFORM),
    AlgorithmSpec("fedlesam_s", "lesam", ("scaffold",), "mean", "FedLESAM with SCAFFOLD control variates.", FEDLESAM,
                  defaults=UNIFORM),
    AlgorithmSpec("fedlesam_d", "lesam", ("feddyn",), "feddyn", "FedLESAM with FedDyn regularisation.", FEDLESAM,
                  defaults=UNIFORM),
    AlgorithmSpec("fedgam", "gam", (), "mean", "Gradient-norm-aware minimisation on the clients.", FEDGAM,
                  defaults={"rho": 0.02, **UNIFORM}),
    AlgorithmSpec("fedgam_cv", "gam", ("scaffold",), "mean",
                  "FedGAM with control variates; the server averages dc_i over the sampled clients (eq. 22).", FEDGAM,
                  defaults={"rho": 0.02, "scaffold_server_average": "sampled", **UNIFORM}),
    AlgorithmSpec("fedup", "none", ("fedup",), "mean",
                  "Clients minimise an upper bound of the global loss built from the last global update.",
                  "FedUp: federated learning by minimising an upper bound of the global loss, 2024",
                  defaults={"fedup_eta": "constant", **UNIFORM}),
    AlgorithmSpec("fedgh", "none", (), "mean+fedgh", "FedAvg with gradient harmonization of conflicting updates.",
                  "Zhang et al., Tackling the Non-IID Issue in Heterogeneous Federated Learning by Gradient "
                  "Harmonization, IEEE SPL 2024", defaults=UNIFORM),
):
    register_preset(spec)

# --- the seeds' other baselines ---------------------------------------------------------------------------
for spec in (
    AlgorithmSpec("moon", "none", ("moon",), "mean",
                  "Model-contrastive loss pulling the representation to the global model's, away from the previous "
                  "local model's.", "Li et al., Model-Contrastive Federated Learning, CVPR 2021"),
    AlgorithmSpec("feddecorr", "none", ("feddecorr",), "mean",
                  "Decorrelation of the representation's dimensions (||K||_F^2 / d^2) against dimensional collapse.",
                  "Shi et al., Towards Understanding and Mitigating Dimensional Collapse in Heterogeneous Federated "
                  "Learning, ICLR 2023"),
    AlgorithmSpec("fedcm", "none", ("momentum",), "mean",
                  "Client-level momentum: d = a*g + (1-a)*Delta^{t-1}, Delta the last global update per local step.",
                  "Xu et al., FedCM: Federated Learning with Client-level Momentum, 2021",
                  defaults={"momentum_alpha": 0.1, "momentum_first_round": "zero_momentum", **UNIFORM}),
    AlgorithmSpec("feddc", "none", ("feddc", "scaffold"), "shifted_mean",
                  "Local drift variable h_i (penalty alpha/2 ||w + h_i - w^t||^2) with SCAFFOLD's gradient "
                  "correction; the server averages w_i + h_i.",
                  "Gao et al., FedDC: Federated Learning with Non-IID Data via Local Drift Decoupling and Correction, "
                  "CVPR 2022", defaults=UNIFORM),
    AlgorithmSpec("fedspeed", "fedspeed_sam", ("fedspeed",), "shifted_mean",
                  "Merged SAM gradient with a prox-correction term; clients send w_i - lambda g_hat_i.",
                  "Sun et al., FedSpeed: Larger Local Interval, Less Communication Round, and Higher Generalization "
                  "Accuracy, ICLR 2023", defaults=UNIFORM),
):
    register_preset(spec)
register_preset(AlgorithmSpec(
    "mimelite", "none", ("mimelite",), "mean",
    "Clients step with the server's momentum (fixed in the round); the server updates it with the clients' "
    "full-batch gradients at the global model.",
    "Karimireddy et al., Breaking the centralized barrier for cross-device federated learning (Mime), NeurIPS 2021",
    defaults=UNIFORM))

# --- newer flatness methods: FedASAM --------------------------------------------------------------------------
register_preset(AlgorithmSpec(
    "fedasam", "asam", (), "mean",
    "Local adaptive SAM steps (the ascent step scaled by |w| + eta_a per weight entry), weighted average.",
    "Caldarola et al., Improving Generalization in Federated Learning by Seeking Flat Minima, ECCV 2022"))
register_preset(AlgorithmSpec(
    "fedgmt", "none", ("fedgmt",), "fedgmt",
    "Distillation towards a moving average of the global models (global sharpness from the trajectory), with "
    "FedDyn-like linear duals.",
    "Li et al., One Arrow, Two Hawks: Sharpness-aware Minimization for Federated Learning via Global Model "
    "Trajectory (FedGMT), ICML 2025"))
register_preset(AlgorithmSpec(
    "fedwmsam", "wmsam", (), "mean",
    "One-pass SAM along the momentum's predicted path, mixed with a personalized server momentum whose weight "
    "adapts each round; SCAFFOLD variates.",
    "Li et al., FedWMSAM: Fast and Flat Federated Learning via Weighted Momentum and Sharpness-Aware Minimization, "
    "NeurIPS 2025", defaults=UNIFORM))

# --- newer flatness methods: FedGloSS, FedSWA (server halves; FedSWA is the +swa plug-in on any server preset) ---
register_preset(AlgorithmSpec(
    "fedgloss", "sam", ("fedgloss",), "fedgloss",
    "SAM on the server along the last pseudo-gradient (sent as w~), SAM clients with ADMM duals sigma_k, sigma.",
    "Caldarola et al., Beyond Local Sharpness: Communication-Efficient Global Sharpness-aware Minimization for "
    "Federated Learning, CVPR 2025", defaults={"rho": 0.15, "rho_warmup_rounds": 2000}))
register_preset(AlgorithmSpec(
    "fedswa", "none", (), "mean+swa",
    "FedAvg with a cyclic client learning rate from 0.75 T and the server's average of the cycle-end models.",
    "Caldarola et al., Improving Generalization in Federated Learning by Seeking Flat Minima, ECCV 2022"))

# --- client-level differential privacy: the +dp plug-in (any server preset takes it: fedlesam+dp) ----------------
DP_FEDAVG = "McMahan et al., Learning Differentially Private Recurrent Language Models, ICLR 2018"
DP_FEDSAM = "Shi et al., Make Landscape Flatter in Differentially Private Federated Learning, CVPR 2023"
#: DP-FedSAM's set-up as data: clipping C 0.2, noise multiplier 0.95 added on the clients, a uniform mean
DP_SETUP = {"dp_clip_norm": 0.2, "dp_noise_multiplier": 0.95, "dp_noise": "client", **UNIFORM}
for spec in (
    AlgorithmSpec("dp_fedavg", "none", (), "mean+dp",
                  "Local SGD; each client clips its update to C and adds Gaussian noise before sending (DP-FedSAM's "
                  "baseline set-up); uniform mean.", DP_FEDAVG, defaults=DP_SETUP),
    AlgorithmSpec("dp_fedsam", "sam", (), "mean+dp",
                  "Local SAM steps; each client clips its update to C and adds Gaussian noise before sending.",
                  DP_FEDSAM, defaults={"rho": 0.5, **DP_SETUP}),
):
    register_preset(spec)

# --- decentralized: perturbation x gossip (no server); local step, sampling and gossip are shared code ----------
#: the seeds' decentralized set-up: every client trains every round (only the server baselines sample 10%)
FULL = {"decentralized_participation": "full"}

for spec in (
    AlgorithmSpec("dfedavg", "none", (), "gossip", "Local SGD steps, then gossip with the neighbours.",
                  "Sun et al., Decentralized Federated Averaging, IEEE TPAMI 2022", defaults=FULL),
    # torch SGD's momentum (dampening 0) is heavy ball: b <- 0.9 b + d, w <- w - lr b. The local optimizer is
    # rebuilt for every client every round, so the momentum buffer starts from zero each round.
    AlgorithmSpec("dfedavgm", "none", (), "gossip",
                  "Local SGD with heavy-ball momentum (reset every round), then gossip.",
                  "Sun et al., Decentralized Federated Averaging, IEEE TPAMI 2022",
                  defaults={"optim_args": "momentum=0.9", **FULL}, method_fields=("optim_args",)),
    # the paper: every client steps every iteration
    AlgorithmSpec("dpsgd", "none", (), "gossip", "One local SGD step per gossip step (adapt-then-combine D-PSGD).",
                  "Lian et al., Can Decentralized Algorithms Outperform Centralized Algorithms?, NeurIPS 2017",
                  defaults={"local_steps": 1, **FULL}, method_fields=("local_steps",)),
    AlgorithmSpec("dfedsam", "sam", (), "gossip", "Local SAM steps, then gossip.",
                  "Shi et al., Improving the Model Consistency of Decentralized Federated Learning, ICML 2023",
                  defaults={"rho": 0.05, **FULL}),
    # the seed: every client runs its local steps every round; rho searched in {0.05, ..., 2.0} (0.1 here)
    AlgorithmSpec("dfedgam", "gam_first_order", (), "gossip",
                  "Local first-order-flatness GAM steps (delta = rho*Hg/||Hg||, d = grad F(w + delta)), then gossip.",
                  "DFedGAM (2025, seed paper), eq. (7)-(8) and Algorithm 1: decentralized gradient norm aware "
                  "minimization", defaults={"rho": 0.1, **FULL}),
):
    register_preset(spec)
