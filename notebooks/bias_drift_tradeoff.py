# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Why freeze the attention kernel? The bias–drift trade-off of FedFrozen
#
# **The question.** With a budget of $T$ federated rounds, FedFrozen (arXiv:2605.06446) trains
# an attention layer with $T_0$ rounds of FedAvg on every block, then freezes the query/key block
# and trains only the value block. How long should the warm-up $T_0$ be? You will answer it with
# code in **45–50 minutes**: about 14 minutes of reading (≈ 2,300 words at 170 words a minute), a
# few minutes to skim the code, and 7 exercises (9 answers) of 2–5 minutes each.
#
# **How to work.** Run the cells from top to bottom (in Jupyter, or headless with
# `python notebooks/execute.py --out my_run.ipynb`, which prints every check). An *exercise* is a
# function whose body is `raise NotImplementedError`: replace that line by your answer, run the
# cell, then run the check cell below it. The check compares **your** answer with an independent
# computation and prints `EXERCISE <name>: PASS`, `FAIL` (with what went wrong) or `UNANSWERED`;
# it never stops the notebook, so you can skip an exercise and come back. Two other kinds of
# lines appear:
#
# - `THEOREM …: holds` — an exact identity of the theory. If one is violated the cell raises an
#   error: that is a bug in the code, not a property of your numbers.
# - `TENDENCY …: holds / does NOT hold on these numbers` — what the theory expects in the typical
#   case. Change the settings (try `E = 5` in section 3) and see whether it survives.
#
# The mathematics is `docs/theory.md` (cited as §1–§6); every displayed formula below is copied
# from it. Solutions are in `notebooks/solutions.py`: look only after trying.

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from linattn_theory import (ClientDataset, FederatedDataset, config_from_dict, context_second_moment,
                            contraction_rate, fedavg_fixed_point, frozen_stage_map, kernel, loss_and_grad,
                            planted_kernel_clients, predict, profile_objective, simulate, stack_clients,
                            value_drift_floor, value_moments)
from linattn_theory.report import plotting
from linattn_theory.report.teaching import (best_warmup, check_exercise, committed_table, excess_risk_curve,
                                            notebook_style, show, tendency, theorem)
from linattn_theory.sim.engine import initial_params
from linattn_theory.theory.inexactness import local_steps, replay_round
from linattn_theory.theory.profile import centralized_optimum

notebook_style()        # the figures' colours (one per method and per heterogeneity level), 150 dpi, 8-9 pt text

# %% [markdown]
# ## 1. One linear-attention head and two clients (§1, §2)
#
# A sample is a context of $n$ tokens stacked as the rows of $X \in \mathbb{R}^{n\times d}$, a
# query token $q \in \mathbb{R}^d$ and a target $y \in \mathbb{R}^p$. One head $h$ has query and
# key matrices $W_Q^h, W_K^h \in \mathbb{R}^{d\times r}$ and a value matrix
# $W_V^h \in \mathbb{R}^{d\times p}$; we use $H = 1$ head. It scores the query against token $x_i$
# without a softmax:
#
# $$
# s_h(q, x_i) = (W_Q^{h\top} q)^\top (W_K^{h\top} x_i) = q^\top K_h\, x_i,
# \qquad K_h = W_Q^h W_K^{h\top} \in \mathbb{R}^{d\times d}.
# $$
#
# $K_h$ is the **attention kernel**: it decides *where* the head looks; $W_V^h$ decides *what* it
# reads. The prediction is the score-weighted average of the value-projected tokens:
#
# $$
# \hat y = \sum_{h=1}^H \frac1n \sum_{i=1}^n s_h(q, x_i)\, W_V^{h\top} x_i
#        = \sum_h W_V^{h\top} \Big(\frac1n\sum_i x_i x_i^\top\Big) K_h^\top q
#        = \sum_h W_V^{h\top}\, \hat S\, K_h^\top q,
# \qquad \hat S = \frac{X^\top X}{n}.
# $$
#
# The loss of a sample is $\ell = \tfrac12\|\hat y - y\|^2$, averaged over a batch.
#
# **Clients.** There are $m = 2$ clients; client $c$ holds $N_c$ samples and the weight
# $p_c = N_c / \sum_{c'} N_{c'}$. Ours are of unequal size, $N_c = 128, 64$ ($p_c = 2/3, 1/3$), so
# that every weighted average below has to use the weights. The data come from a teacher with kernel $K^*$ shared by all
# clients, but client $c$ maps the teacher's features through its own value map
# $V^*_c = \bar V + \zeta_V \Delta_c$: the knob $\zeta_V$ (`zeta_value`) is the **concept
# heterogeneity**. The clients' token variances also differ a little (covariate knob
# $\zeta_X$ = `zeta_covariate` = 0.2).

# %%
DIM, TOKENS, RANK, OUTPUTS, SAMPLES = 6, 8, 2, 2, (128, 64)  # d, n, r, p, and N_c of the two clients
ZETA = 2.0                                                   # ζ_V of the main example


def two_clients(zeta=ZETA, seed=0):
    """Two planted-kernel clients with concept heterogeneity ζ_V = zeta (docs/theory.md §2), of sizes SAMPLES."""
    drawn = planted_kernel_clients(num_clients=2, samples_per_client=max(SAMPLES), tokens=TOKENS, dim=DIM,
                                   rank=RANK, outputs=OUTPUTS, zeta_value=zeta, zeta_covariate=0.2,
                                   noise=0.1, seed=seed)
    kept = tuple(ClientDataset(*(a[:N] for a in client)) for client, N in zip(drawn, SAMPLES))
    return FederatedDataset(kept, np.array(SAMPLES) / sum(SAMPLES), drawn.family, drawn.truth)


def initial(seed=0):
    """θ^0, drawn exactly as the simulator draws it for this seed."""
    return initial_params(config_from_dict({"seed": seed, "model": {"rank": RANK}}), DIM, OUTPUTS)


clients = two_clients()
params0 = initial()             # Params with WQ, WK of shape (H, d, r) and WV of shape (H, d, p)
X, q, y = clients[0]            # client 0's samples: X (N_c, n, d), q (N_c, d), y (N_c, p)
print("X", X.shape, " q", q.shape, " y", y.shape, "  p_c =", clients.weights)

fig, axes = plt.subplots(1, 2, figsize=(7, 3))
for ax, K, title in [(axes[0], clients.truth["kernel"][0], "teacher kernel $K^*$"),
                     (axes[1], kernel(params0)[0], r"initial kernel $K$ of $\theta^0$")]:
    image = ax.imshow(K, cmap="RdBu_r", vmin=-np.abs(K).max(), vmax=np.abs(K).max())
    ax.set(title=title, xlabel="key coordinate", ylabel="query coordinate")
    ax.grid(False)
    fig.colorbar(image, ax=ax, shrink=0.8)
show(fig)

# %% [markdown]
# **Exercise 1 (scale symmetry).** Return parameters whose kernel is $cK$ and whose value matrix
# is $W_V/c$, by scaling $W_Q$ (a `Params` has `.WQ`, `.WK`, `.WV` and `.replace(WQ=…, WV=…)`).
# Predict first: do the predictions change? The check compares `predict` on both.

# %% tags=["exercise"]
def rescale(params, c):
    """Parameters with kernel c·K and value matrix W_V / c."""
    raise NotImplementedError

# %%
def verify_rescale(new):
    same_kernel = np.allclose(kernel(new), 3.0 * kernel(params0), rtol=1e-12, atol=0)
    same_predictions = np.allclose(predict(new, X, q), predict(params0, X, q), rtol=1e-10, atol=1e-12)
    return same_kernel and same_predictions, (f"kernel is 3K: {same_kernel}; "
                                              f"predictions unchanged: {same_predictions}")


check_exercise("1 scale symmetry", lambda: rescale(params0, 3.0), verify_rescale)

# %% [markdown]
# A kernel is only meaningful up to its scale.
#
# ## 2. Closed-form gradients (§1)
#
# For one head and one sample introduce
#
# $$
# u = W_Q^{h\top} q \in \mathbb{R}^r,\quad
# k = W_K^h u = K_h^\top q \in \mathbb{R}^d,\quad
# \varphi_h = \hat S k,\quad
# e = \hat y - y \in \mathbb{R}^p,\quad
# g = \hat S W_V^h e \in \mathbb{R}^d .
# $$
#
# Then (docs/theory.md §1 derives them in three lines)
#
# $$
# \nabla_{W_V^h}\ell = \varphi_h e^\top,\qquad
# \nabla_{K_h}\ell = q g^\top,\qquad
# \nabla_{W_Q^h}\ell = \nabla_{K_h}\ell\; W_K^h = q\,(W_K^{h\top} g)^\top,\qquad
# \nabla_{W_K^h}\ell = (\nabla_{K_h}\ell)^\top W_Q^h = g\, u^\top .
# $$
#
# The batch gradient is the mean over samples; `loss_and_grad(params, X, q, y)` evaluates these
# formulas.
#
# **Exercise 2 (the value gradient).** Compute $\nabla_{W_V}$ of the batch loss of client 0 for
# the one-head model, shape $(d, p)$, with plain NumPy (`context_second_moment(X)` gives
# $\hat S$ for every sample). The check compares it with `loss_and_grad` and with a finite
# difference of the loss (exact here: the loss is quadratic in $W_V$).

# %% tags=["exercise"]
def value_gradient(params, X, q, y):
    """∇_{W_V} of the batch loss: the mean over samples of φ e^T, shape (d, p), for one head."""
    raise NotImplementedError

# %%
def verify_value_gradient(mine):
    mine = np.asarray(mine, dtype=float).reshape(DIM, OUTPUTS)
    closed_form = loss_and_grad(params0, X, q, y)[1].WV[0]
    direction = np.random.default_rng(1).normal(size=(DIM, OUTPUTS))
    h = 1e-3

    def loss_along(t):
        return loss_and_grad(params0.replace(WV=params0.WV + t * direction[None]), X, q, y)[0]
    finite_difference = (loss_along(h) - loss_along(-h)) / (2 * h)
    mine_along = float(np.sum(mine * direction))
    error_closed = np.abs(mine - closed_form).max() / np.abs(closed_form).max()
    error_fd = abs(mine_along - finite_difference) / abs(finite_difference)
    return error_closed < 1e-10 and error_fd < 1e-7, (f"relative error vs loss_and_grad {error_closed:.1e}, "
                                                      f"vs finite difference {error_fd:.1e}")


check_exercise("2 value gradient", lambda: value_gradient(params0, X, q, y), verify_value_gradient)

# %% [markdown]
# ## 3. FedAvg and client drift (§3)
#
# In round $t$ the server holds $\theta^t = (W_Q, W_K, W_V)$. Every client starts from
# $\theta_c^{t,0} = \theta^t$ and takes $E$ gradient steps of size $\eta$ on its *own* objective
# $F_c(\theta) = \mathbb{E}_c\,\ell(\theta)$ ($\mathbb{E}_c$: the mean over its samples), reaching
# $\theta_c^{t,E}$. The server then averages the models of the participants $\mathcal S_t$ (here all
# clients, so the renormalised weights are $\tilde p_c = p_c$) and moves along the average change
# with the server step $\eta_s = 1$:
#
# $$
# \theta^{t+1} = \theta^t + \eta_s \sum_{c\in\mathcal S_t} \tilde p_c\,(\theta_c^{t,E} - \theta^t).
# $$
#
# This is FedAvg. The global objective is $F(\theta) = \sum_c p_c F_c(\theta)$; $F_{\lambda,c}$ and
# $F_\lambda$ add the ridge $\tfrac\lambda2\|W_V\|_F^2$ of §4, and we take $\lambda = 0$. With
# $E = 1$ a round is exactly a gradient step:
#
# $$
# \theta^{t+1} = \sum_c p_c\big(\theta^t - \eta\nabla F_{\lambda,c}(\theta^t)\big)
# = \theta^t - \eta \nabla F_\lambda(\theta^t),
# $$
#
# With $E > 1$ each client walks towards *its own* optimum and the clients' models pull apart:
# **client drift**. The figure shows the distance between the two clients' kernels after $e$ local
# steps $j$, for several $\zeta_V$.

# %%
ETA, E = 0.04, 20          # local step size η and local steps per round E (try E = 5 later)
LAM = 0.0                  # the value ridge λ of §4 (none)


def kernel_gap(pair, steps):
    """‖K_1 − K_2‖_F after `steps` local steps of the two clients `pair` from θ^0."""
    K_clients = kernel(local_steps(params0, pair, ETA, steps))   # (m, H, d, d)
    return float(np.linalg.norm(K_clients[0] - K_clients[1]))


zetas = [0.0, 1.0, 2.0, 3.0]
pairs = {z: two_clients(z) for z in zetas}
gaps = {z: [kernel_gap(pairs[z], e) for e in range(E + 1)] for z in zetas}
fig, ax = plt.subplots(figsize=(5, 3.2))
for z in zetas:
    ax.plot(gaps[z], color=plotting.heterogeneity_color(z), label=plotting.heterogeneity_label(z))
ax.set(xlabel="local step $j$", ylabel=r"$\|K_1 - K_2\|_F$", title="the clients' kernels drift apart")
ax.legend()
show(fig)
tendency("drift grows with heterogeneity", bool(np.all(np.diff([gaps[z][-1] for z in zetas]) > 0)),
         "(kernel gap after E steps for ζ_V = " + ", ".join(f"{z:g}: {gaps[z][-1]:.3f}" for z in zetas) + ")")

# %% [markdown]
# **Exercise 3 (the server's step).** `local_steps(theta, clients, η, E)` returns every client's
# model after its local steps, stacked on a leading client axis. Write the server's step with
# $\eta_s = 1$: the $p_c$-weighted average of the client models, block by block. The check
# compares it with the package's round `replay_round` on our clients ($p_c = 2/3, 1/3$).

# %% tags=["exercise"]
def server_average(client_models, weights):
    """Σ_c p_c θ_c^{t,E} block by block; client_models is a Params with a leading client axis."""
    raise NotImplementedError

# %%
def verify_server_average(mine):
    package = replay_round(params0, clients, ETA, E)[0]
    error = max(float(np.abs(getattr(mine, b) - getattr(package, b)).max()) for b in ("WQ", "WK", "WV"))
    return error < 1e-12, f"max |yours − replay_round| = {error:.1e}"


check_exercise("3 server average",
               lambda: server_average(local_steps(params0, clients, ETA, E), clients.weights),
               verify_server_average)

# E = 1: three rounds of the package's simulator against three centralised gradient steps on F
config_e1 = config_from_dict({"seed": 0, "model": {"rank": RANK}, "federated": {
    "strategy": "fedavg", "rounds": 3, "warmup_rounds": 3, "local_steps": 1, "learning_rate": ETA, "ridge": LAM}})
simulated = simulate(config_e1, clients=clients).params
centralised = params0
for _ in range(3):
    centralised = local_steps(centralised, clients, ETA, 1, centralized=True)
gap_e1 = max(float(np.abs(getattr(simulated, b) - getattr(centralised, b)).max()) for b in ("WQ", "WK", "WV"))
theorem("FedAvg with E = 1 is gradient descent on F", gap_e1 < 1e-12, f"(max difference {gap_e1:.1e})")

# %% [markdown]
# ## 4. How good is a kernel? The kernel-profile objective (§4)
#
# For a fixed kernel the model is linear in the value block $V$ (here $V = W_V$): with the features
# $\varphi = \hat S K^\top q$, client $c$'s objective is a quadratic in $V$,
#
# $$
# F_c(K, V) = \tfrac12 \operatorname{tr}(V^\top A_c V) - \operatorname{tr}(V^\top B_c) + \tfrac12 y2_c,
# \qquad A_c(K) = \mathbb{E}_c[\varphi\varphi^\top],\quad B_c(K) = \mathbb{E}_c[\varphi y^\top],\quad
# y2_c = \mathbb{E}_c\|y\|^2 .
# $$
#
# $A, B, y2$ without index are the $p_c$-weighted sums. With a ridge $\tfrac\lambda2\|V\|_F^2$ on the
# value block (objective $F_\lambda$, curvature $\tilde A = A + \lambda I$; we take $\lambda = 0$),
# the best value block and the best loss under the kernel $K$ are
#
# $$
# V^*_\lambda(K) = \tilde A^{-1} B, \qquad
# \Phi_\lambda(K) = \min_V F_\lambda(K, V) = \tfrac12 y2 - \tfrac12 \operatorname{tr}(B^\top \tilde A^{-1} B).
# $$
#
# $\Phi_\lambda$, the **kernel-profile objective**, is the best loss any value block reaches with
# this kernel. Its minimum over kernels, $\Phi^*_\lambda$, is the best loss reachable at all
# (`centralized_optimum`, a solver that sees all the data), and the **kernel-profile bias**
#
# $$
# \operatorname{bias}(K) = \Phi_\lambda(K) - \Phi^*_\lambda \ \ge 0,
# $$
#
# is what a kernel costs once it is frozen. The cell below follows the bias of $K_t$, the kernel
# of $\theta^t$, over $T$ rounds of FedAvg, next to centralised gradient descent on $F$ with as
# many gradient steps ($E$ per round, no drift); exercise 4b asks you to predict the outcome before
# the figure shows it.

# %%
T = 80                                   # the budget of rounds
fedavg_kernels, central_kernels = [kernel(params0)], [kernel(params0)]
theta_fedavg, theta_central = params0, params0
for t in range(T):
    theta_fedavg = replay_round(theta_fedavg, clients, ETA, E)[0]
    theta_central = local_steps(theta_central, clients, ETA, E, centralized=True)
    fedavg_kernels.append(kernel(theta_fedavg))
    central_kernels.append(kernel(theta_central))
data = stack_clients(clients)            # the clients in the prepared form the theory functions use
optimum = centralized_optimum(data, LAM, rank=RANK, restarts=2, initial_kernels=[fedavg_kernels[-1],
                                                                                 central_kernels[-1]])
bias_fedavg = np.array([profile_objective(K, data, LAM)[0] for K in fedavg_kernels]) - optimum.objective
bias_central = np.array([profile_objective(K, data, LAM)[0] for K in central_kernels]) - optimum.objective
print(f"Φ* = {optimum.objective:.6f};  bias at round 0: {bias_fedavg[0]:.4f} (both);  at round {T // 4}: "
      f"FedAvg {bias_fedavg[T // 4]:.4f}, centralised GD {bias_central[T // 4]:.4f}")
theorem("Φ_0 does not see the kernel's scale",
        abs(profile_objective(3.0 * fedavg_kernels[10], data, 0.0)[0]
            - profile_objective(fedavg_kernels[10], data, 0.0)[0]) < 1e-10 * optimum.objective,
        "(Φ_0(3K) = Φ_0(K) at K of round 10)")

# %% [markdown]
# **Exercise 4a (what $\Phi_0$ means).** Compute $\Phi_0(K)$ without the formula: build the
# features $\varphi$ of every sample of every client, solve the weighted least-squares problem
# $\min_V \sum_c p_c\, \mathbb{E}_c \tfrac12\|V^\top\varphi - y\|^2$ with `np.linalg.lstsq`
# (multiply the rows of client $c$ by $\sqrt{p_c/N_c}$), and return its minimum. `clients` is a
# sequence of `(X, q, y)` with weights `clients.weights`.

# %% tags=["exercise"]
def profile_by_least_squares(K, clients):
    """Φ_0(K) for a one-head kernel K of shape (d, d), by weighted least squares."""
    raise NotImplementedError

# %%
K_check = fedavg_kernels[10][0]
check_exercise("4a profile by least squares", lambda: profile_by_least_squares(K_check, clients),
               lambda mine: (abs(mine - profile_objective(K_check, data, 0.0)[0]) < 1e-9 * optimum.objective,
                             f"yours {float(mine):.10f}, profile_objective "
                             f"{profile_objective(K_check, data, 0.0)[0]:.10f}"))

# %% [markdown]
# **Exercise 4b (predict, then look).** The cell above printed both biases after $T/4$ rounds.
# After all $T$ rounds, by what factor is the bias of FedAvg's kernel larger than that of
# centralised gradient descent's,
# $\operatorname{bias}(K_T^{\mathrm{FedAvg}}) / \operatorname{bias}(K_T^{\mathrm{GD}})$? A number
# (1: as good; below 1: FedAvg's is better); the check accepts a prediction within 30 % of the
# measured factor. Say the reason in one sentence, then run the check: the figure comes with it.
# Then change `E` in section 3 (say to 5), rerun, and predict again.

# %% tags=["exercise"]
def bias_ratio_after_T_rounds():
    """bias(FedAvg's K_T) / bias(centralised GD's K_T): a number."""
    raise NotImplementedError

# %%
bias_ratio = bias_fedavg[-1] / bias_central[-1]
check_exercise("4b bias ratio", bias_ratio_after_T_rounds,
               lambda answer: (abs(float(answer) - bias_ratio) <= 0.3 * bias_ratio,
                               f"yours {float(answer):g}, measured {bias_ratio:.2f} after T = {T} rounds with "
                               f"E = {E} (bias FedAvg {bias_fedavg[-1]:.4f}, centralised {bias_central[-1]:.4f})"))
fig, ax = plt.subplots(figsize=(5, 3.2))
fedavg_style, gd_style = plotting.method_style("fedavg"), plotting.method_style("centralised")
ax.semilogy(bias_fedavg, color=fedavg_style.color, label=f"{fedavg_style.label}, E = {E}")
ax.semilogy(bias_central, color=gd_style.color, linestyle=gd_style.linestyle, label=gd_style.label)
ax.set(xlabel="round $t$", ylabel=r"bias$(K_t)$", title=rf"kernel quality during training ($\zeta_V = {ZETA:g}$)")
ax.legend()
show(fig)

# %% [markdown]
# The first half of the trade-off: **a longer warm-up buys a better kernel** — at first.
#
# ## 5. The frozen stage: a quadratic problem with a drift floor (§5)
#
# Freeze the kernel at $K = K_{T_0}$ and train only $V$. A local step on client $c$ is affine,
# $V \leftarrow (I - \eta\tilde A_c) V + \eta B_c$, and so is a whole FedAvg round:
#
# $$
# V^{t+1} = M V^t + b, \qquad
# M = \sum_c p_c (I - \eta\tilde A_c)^E, \qquad
# b = \sum_c p_c \sum_{j=0}^{E-1} (I - \eta\tilde A_c)^j\, \eta B_c .
# $$
#
# The rounds converge geometrically at the rate $\rho = \rho(M)$, the spectral radius of $M$, to the
# fixed point
#
# $$
# V_{FA}(K) = \Big(\sum_c p_c P_c\Big)^{-1} \sum_c p_c P_c V^*_c, \qquad
# P_c = I - (I - \eta\tilde A_c)^E, \qquad V^*_c = \tilde A_c^{-1} B_c ,
# $$
#
# which weighs the clients' own optima $V^*_c$ by $P_c$ where the centralised optimum
# $V^*_\lambda(K)$ weighs them by $\tilde A_c$. The loss FedAvg leaves on the table is the
# **value drift floor**
#
# $$
# D(K) = F_\lambda(K, V_{FA}) - \Phi_\lambda(K)
# = \tfrac12\operatorname{tr}\big((V_{FA} - V^*_\lambda)^\top \tilde A\, (V_{FA} - V^*_\lambda)\big) \ \ge 0 .
# $$

# %%
T0_demo = 20
theta_demo = params0
for t in range(T0_demo):
    theta_demo = replay_round(theta_demo, clients, ETA, E)[0]        # θ^{T0} of the FedAvg run
K_frozen = kernel(theta_demo)
M, b = frozen_stage_map(K_frozen, data, ETA, E, LAM)
V_FA = fedavg_fixed_point(K_frozen, data, ETA, E, LAM)
V_star = profile_objective(K_frozen, data, LAM)[1]
rho = contraction_rate(K_frozen, data, ETA, E, LAM)
V = theta_demo.WV.reshape(-1, OUTPUTS)                                   # V^{T0}, shape (H·d, p)
to_fixed_point, to_optimum = [], []
for t in range(60):
    to_fixed_point.append(np.linalg.norm(V - V_FA))
    to_optimum.append(np.linalg.norm(V - V_star))
    V = M @ V + b
fig, ax = plt.subplots(figsize=(5, 3.2))
ax.semilogy(to_fixed_point, "o", ms=2.5, color=plotting.STATISTIC_COLOR, label=r"$\|V^t - V_{FA}\|$")
ax.semilogy(to_fixed_point[0] * rho ** np.arange(60), "--", lw=1, color=plotting.REFERENCE_COLOR,
            label=rf"$\rho^t$, $\rho = {rho:.3f}$")
ax.semilogy(to_optimum, color=plotting.INSTANCE_COLOR, label=r"$\|V^t - V^*_\lambda\|$")
ax.set(xlabel=r"frozen round $t - T_0$", ylabel="distance", title=rf"frozen stage from $K_{{{T0_demo}}}$")
ax.legend()
show(fig)

# the package's simulator, started at V_FA with the kernel frozen, must stay there
config_frozen = config_from_dict({"seed": 0, "model": {"rank": RANK}, "federated": {
    "strategy": "fedfrozen", "rounds": 1, "warmup_rounds": 0, "local_steps": E, "learning_rate": ETA,
    "ridge": LAM}})
start = theta_demo.replace(WV=V_FA.reshape(theta_demo.WV.shape))
moved = np.abs(simulate(config_frozen, clients=clients, params=start).params.WV - start.WV).max()
theorem("V_FA is the fixed point of the simulator's frozen round", moved < 1e-10 * np.abs(V_FA).max(),
        f"(one round moves it by {moved:.1e})")

# %% [markdown]
# **Exercise 5a (the drift floor).** Compute $D$ from $V_{FA}$, $V^*_\lambda$ and $\tilde A$ by
# the formula above. The check compares it with `value_drift_floor`, which computes
# $F_\lambda(K, V_{FA}) - \Phi_\lambda(K)$ from the moments.

# %% tags=["exercise"]
def drift_floor(V_FA, V_star, A_tilde):
    """D = ½ tr((V_FA − V*)^T Ã (V_FA − V*))."""
    raise NotImplementedError

# %%
A_tilde = value_moments(K_frozen, data).weighted()[0] + LAM * np.eye(V_FA.shape[0])
D_package = value_drift_floor(K_frozen, data, ETA, E, LAM)
check_exercise("5a drift floor", lambda: drift_floor(V_FA, V_star, A_tilde),
               lambda mine: (abs(float(mine) - D_package) < 1e-9 * D_package,
                             f"yours {float(mine):.6e}, value_drift_floor {D_package:.6e}"))

# E = 1: P_c = η Ã_c, so V_FA = V*_λ. Identical inputs: all Ã_c equal, so again V_FA = V*_λ.
D_e1 = value_drift_floor(K_frozen, data, ETA, 1, LAM)
theorem("no drift floor with one local step", D_e1 < 1e-12 * D_package, f"(D = {D_e1:.1e} at E = 1)")
X0, q0, y0 = clients[0]
other_targets = np.concatenate([clients[1].y, clients[1].y])       # client 1's targets, on client 0's inputs
D_same_inputs = value_drift_floor(K_frozen, [(X0, q0, y0), (X0, q0, other_targets)], ETA, E, LAM)
theorem("no drift floor when the clients share their inputs", D_same_inputs < 1e-12 * D_package,
        f"(D = {D_same_inputs:.1e})")

# %% [markdown]
# For small $\eta$ the theory expands $V_{FA} - V^*_\lambda$ to first order (§5) and finds
#
# $$
# D \propto \eta^2 (E-1)^2 \zeta^2 ,
# $$
#
# where $\zeta$ measures how far apart the clients' optima are; at a fixed kernel it grows in
# proportion to $\zeta_V$.
#
# **Exercise 5b (predict).** At the teacher kernel $K^*$, by what factor does $D$ grow when
# $\zeta_V$ doubles from 2 to 4? Return a number. The check measures it (within 25 %).

# %% tags=["exercise"]
def drift_floor_factor_when_zeta_doubles():
    """D(ζ_V = 4) / D(ζ_V = 2) at the teacher kernel: a number."""
    raise NotImplementedError

# %%
K_teacher = clients.truth["kernel"]
ratio = value_drift_floor(K_teacher, two_clients(4.0), ETA, E, LAM) / value_drift_floor(K_teacher, two_clients(2.0),
                                                                                        ETA, E, LAM)
check_exercise("5b drift floor factor", drift_floor_factor_when_zeta_doubles,
               lambda answer: (abs(float(answer) - ratio) <= 0.25 * ratio,
                               f"yours {float(answer):g}, measured {ratio:.2f}"))
D_eta = [value_drift_floor(K_teacher, data, eta, E, LAM) for eta in (0.002, 0.001)]
slope = np.log(D_eta[0] / D_eta[1]) / np.log(2)
tendency("D ∝ η² at small η", abs(slope - 2) < 0.25, f"(log–log slope in η: {slope:.2f})")

# %% [markdown]
# ## 6. The excess risk and its three parts (§6)
#
# With a budget of $T$ rounds and a warm-up of $T_0$ rounds, FedFrozen's final model is
# $\theta_T = (K_{T_0}, V_T)$. Its excess risk over the best reachable loss splits exactly:
#
# $$
# R(T_0) = F_\lambda(\theta_T) - \Phi^*_\lambda .
# $$
#
# $$
# R(T_0) = \underbrace{\operatorname{bias}(K_{T_0})}_{\text{kernel-profile bias}}
# + \underbrace{D(K_{T_0})}_{\text{value drift floor}}
# + \underbrace{\big[F_\lambda(K_{T_0}, V_T) - F_\lambda(K_{T_0}, V_{FA})\big]}_{\text{unfinished value optimisation}} .
# $$
#
# The bias falls with $T_0$ (at first), the drift floor tends to grow with it, and the unfinished
# part shrinks like $\rho^{T-T_0}$, so a late freeze leaves it large. $T_0 = T$ is plain FedAvg.
# The **best warm-up** is $\arg\min_{T_0} R(T_0)$ (the earliest one on ties). Every run with warm-up
# $T_0$ shares its first $T_0$ rounds with the FedAvg run, so the whole sweep over
# $T_0 = 0, \dots, T$ costs little (`excess_risk_curve`, which runs the package's simulator).

# %%
def make_config(seed=0):
    """FedFrozen with this notebook's settings; `excess_risk_curve` sweeps its warm-up T0 = 0..T."""
    return config_from_dict({"seed": seed, "model": {"rank": RANK}, "federated": {
        "strategy": "fedfrozen", "rounds": T, "warmup_rounds": 0, "local_steps": E,
        "learning_rate": ETA, "ridge": LAM}})


curve = excess_risk_curve(make_config(), clients, optimum)
R = curve["excess_risk"]
best_T0 = best_warmup(R)
residual = float(curve["identity_residual"].abs().max())
theorem("R = bias + drift floor + unfinished, at every T0", residual < 1e-9 * float(R.min()),
        f"(largest residual {residual:.1e}; R measured by the simulator, the parts from the moments)")
print(f"best T0 = {best_T0}: R = {R[best_T0]:.4f};  FedAvg (T0 = T): R = {R[T]:.4f};  "
      f"frozen at once (T0 = 0): R = {R[0]:.4f}")

level = plotting.heterogeneity_color(ZETA)            # the colour of ζ_V = 2 in every figure
fig, ax = plt.subplots(figsize=(7, 3.4))
ax.semilogy(curve.index, R, color=level, lw=2.2, label=r"$R(T_0)$")
ax.semilogy(curve.index, curve["bias"], color=level, lw=1, label="bias")
ax.semilogy(curve.index, curve["drift_floor"], "--", color=level, label="drift floor $D$")
ax.semilogy(curve.index, curve["unfinished"].abs(), ":", color=level, lw=1.4, label="|unfinished|")
ax.axvline(best_T0, color=plotting.REFERENCE_COLOR, ls="-.", lw=1, label=rf"best $T_0 = {best_T0}$")
ax.set_ylim(1e-4, 2 * R.max())
ax.set(xlabel=r"warm-up length $T_0$", ylabel=r"loss above $\Phi^*_\lambda$",
       title=rf"one instance: $\zeta_V = {ZETA:g}$, $E = {E}$, $T = {T}$")
ax.legend(loc="upper left", bbox_to_anchor=(1, 1))
show(fig)

# %% [markdown]
# **What the figures measure.** One instance shows one curve; how much a warm-up gains over plain
# FedAvg varies from instance to instance. The repository's figures measure it over many: at the
# settings of the paper (eight clients, $E = 10$, $T = 40$, twenty instances per level; the
# [headline figure](../figures/tradeoff.png) and `figures/README.md`) the median gain is small at
# $\zeta_V \le 2$, and $R(T_0)$ is U-shaped, with a best warm-up well before $T$, only under strong
# heterogeneity. That FedAvg runs at the same step as FedFrozen, not tuned: against a tuned FedAvg
# the fair comparison is the phase diagram (`figures/phase_diagram.png`). The cell reads the
# committed per-instance table behind that figure (`figures/best_warmup.csv`, found from the
# repository, from `notebooks/` or in the installed package); a win is a gain above 2 %, and a
# chaotic instance is one whose numbers move when its start moves by 1e-12 (docs/theory.md §6).

# %%
measured = committed_table("best_warmup.csv")     # figures/best_warmup.csv: one row per instance of the headline figure
for zeta, sub in measured.groupby("zeta_value"):
    print(f"ζ_V = {zeta:g}: FedFrozen at its best T0, against FedAvg at the same step (not tuned), wins "
          f"(gain above 2 %) in {int((sub['gain'] > 0.02).sum())} of {len(sub)} instances ({int(sub['chaotic'].sum())} "
          f"chaotic); median gain {100 * sub['gain'].median():.1f} %, median best T0 = "
          f"{sub['best_T0'].median():g} of T = {int(sub['T'].max())}")

# %% [markdown]
# **Exercise 6 (why the sweep is cheap).** After freezing at $T_0$ the value block follows
# $V^{t+1} = M V^t + b$, so $V^t - V_{FA} = M^{t - T_0}(V^{T_0} - V_{FA})$. Write $V_T$ from
# $V^{T_0}$, $M$, $V_{FA}$ and the number $k = T - T_0$ of frozen rounds, without a loop
# (`np.linalg.matrix_power`). The check runs the package's simulator with $T_0 = 20$.

# %% tags=["exercise"]
def final_value_block(V_T0, M, V_FA, k):
    """V_T after k frozen rounds, from the affine map's closed form."""
    raise NotImplementedError

# %%
run = simulate(make_config().with_updates({"federated.warmup_rounds": T0_demo}), clients=clients)
V_T0_run, V_T_run = run.warmup_params.WV.reshape(-1, OUTPUTS), run.params.WV.reshape(-1, OUTPUTS)
check_exercise("6 final value block", lambda: final_value_block(V_T0_run, M, V_FA, T - T0_demo),
               lambda mine: (np.abs(np.asarray(mine) - V_T_run).max() < 1e-9 * np.abs(V_T_run).max(),
                             f"max |yours − simulator| = {np.abs(np.asarray(mine) - V_T_run).max():.1e}"))

# %% [markdown]
# ## 7. More heterogeneity: freeze earlier or later?
#
# More heterogeneous clients drift more, in the kernel and in the value stage, so the theory
# expects the drift side of the U to rise sooner: a tendency, not a theorem.
#
# The cell below repeats the sweep of section 6 for three data seeds at a low and a high
# heterogeneity, `zeta_low` and `zeta_high`; it prints the best warm-up at `zeta_low` only.

# %%
zeta_low, zeta_high = 0.5, 2.0
seeds = (0, 1, 2)
curves = {(seed, zeta): excess_risk_curve(make_config(seed), two_clients(zeta, seed), optimum=None)["excess_risk"]
          for seed in seeds for zeta in (zeta_low, zeta_high)}
best = {key: best_warmup(R_z) for key, R_z in curves.items()}
print("best T0 at ζ_V = " + f"{zeta_low:g}: " + ", ".join(f"seed {s}: {best[s, zeta_low]}" for s in seeds))

# %% [markdown]
# **Exercise 7 (predict, then look).** When $\zeta_V$ grows from `zeta_low` to `zeta_high`, by how
# many rounds does the best warm-up move, $T_0^{\mathrm{best}}(\zeta_{\mathrm{high}}) -
# T_0^{\mathrm{best}}(\zeta_{\mathrm{low}})$, as the median over the three seeds? A number of
# rounds (negative: earlier; section 6 found the best warm-up of seed 0 at $\zeta_V = 2$). The check
# accepts the right sign and an error of at most $T/4$ rounds, then shows the curves. Then try your own `zeta_low`, `zeta_high` (or `E`).

# %% tags=["exercise"]
def best_warmup_shift():
    """Median over the seeds of T0_best(zeta_high) − T0_best(zeta_low), in rounds: a number."""
    raise NotImplementedError

# %%
shifts = [best[s, zeta_high] - best[s, zeta_low] for s in seeds]
shift = float(np.median(shifts))
detail = ", ".join(f"seed {s}: {best[s, zeta_low]} → {best[s, zeta_high]}" for s in seeds)
check_exercise("7 best warm-up shift", best_warmup_shift,
               lambda answer: (np.sign(float(answer)) == np.sign(shift) and abs(float(answer) - shift) <= T / 4,
                               f"yours {float(answer):g}, measured {shift:g} rounds (best T0, ζ low → high: {detail})"))
fig, axes = plt.subplots(1, len(seeds), figsize=(7, 2.8), sharey=True)
for ax, seed in zip(axes, seeds):
    for zeta in (zeta_low, zeta_high):
        R_z, color = curves[seed, zeta], plotting.heterogeneity_color(zeta)
        ax.semilogy(R_z.index, R_z, color=color, label=plotting.heterogeneity_label(zeta))
        ax.plot(best[seed, zeta], R_z[best[seed, zeta]], "D", color=color, markeredgecolor="black")
    ax.set(xlabel=r"warm-up length $T_0$", title=f"seed {seed}")
axes[0].set_ylabel(r"$R(T_0)$ (diamond: best $T_0$)")
axes[-1].legend()
show(fig)
tendency("the best warm-up moves earlier as heterogeneity grows", all(d < 0 for d in shifts), detail)

# %% [markdown]
# ## What to remember
#
# - The kernel $K = W_Q W_K^\top$ decides where a head looks; its quality is $\Phi_\lambda(K)$, the
#   best loss any value block reaches under it.
# - With heterogeneous clients and $E > 1$, FedAvg drifts: the kernel's path bends, and once the
#   kernel is frozen the value stage converges to $V_{FA} \neq V^*_\lambda$, leaving the floor $D$
#   ($D = 0$ for $E = 1$).
# - Freezing trades kernel bias for less drift and a fast, convex value stage. How much that pays
#   is measured over many instances: at the paper's settings the median gain is small unless the
#   clients are strongly heterogeneous, where $R(T_0)$ is U-shaped; the more heterogeneous the
#   clients, the earlier the best warm-up ([headline figure](../figures/tradeoff.png)).
#
# Next: `docs/concepts.md` and `docs/theory.md` §6, where the package also fits a bound
# $U(T_0) \ge R(T_0)$ on one FedAvg run and recommends a warm-up (`linattn recommend`). That bound
# is **a posteriori (descriptive)**: its constants are fitted on the very run it describes, so it
# summarises the trade-off rather than predicting it in advance.
