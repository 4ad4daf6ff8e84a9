"""How good is the warm-up the bound recommends? (docs/theory.md §6)

For each heterogeneity level of the planted-kernel family (ζ_V = ζ_X = ζ), estimate the bound
U(T0) from one FedAvg run (linattn_theory.bound.estimate_bound), then run the exhaustive sweep
T0 = 0..T of FedFrozen simulations (linattn_theory.theory.excess_risk_by_warmup, against the
same Φ*_λ) and print

    T0_theory, the best T0 of the sweep, regret R(T0_theory)/R(T0_best) − 1,

next to plain FedAvg's regret, the closed-form T0*, whether U ≥ R held at every T0 and which
assumptions of the bound were violated on the path.

Setting (chosen so that FedAvg's drift matters): 8 clients, many local steps (E = 20), and a
step size at a fixed fraction of each instance's stability limit, η = 0.1 · 2/max_c λ_max(Ã_c) at
the teacher kernel (covariate heterogeneity changes the curvature by orders of magnitude, so a
common η would be unstable at ζ = 1 or negligible at ζ = 0.25).

Run:  python benchmarks/tradeoff_report.py [--quick] [--zetas 0.25 0.5 1.0] [--seed 0]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from linattn_theory.bound import estimate_bound, path_optimum, warmup_path  # noqa: E402
from linattn_theory.config import config_from_dict  # noqa: E402
from linattn_theory.federated import clients_from_config, stable_learning_rate  # noqa: E402
from linattn_theory.tasks import stack_clients  # noqa: E402
from linattn_theory.theory import excess_risk_by_warmup  # noqa: E402

FULL = {"num_clients": 8, "samples_per_client": 128, "tokens": 8, "dim": 6, "rank": 3, "rounds": 60,
        "local_steps": 20}
#: U and R agree to rounding where the bound is tight (T0 = T: the frozen stage is empty).
ROUNDING = 1e-9
QUICK = {"num_clients": 8, "samples_per_client": 32, "tokens": 8, "dim": 6, "rank": 3, "rounds": 40,
         "local_steps": 20}


def instance(zeta: float, size: dict, seed: int, step_fraction: float):
    """The planted-kernel config at heterogeneity ``ζ`` with ``η = step_fraction · 2/λ_max`` at the teacher."""
    config = config_from_dict({
        "seed": seed,
        "task": {"family": "planted_kernel", "num_clients": size["num_clients"],
                 "samples_per_client": size["samples_per_client"], "tokens": size["tokens"], "dim": size["dim"],
                 "rank": size["rank"], "outputs": 2, "zeta_value": zeta, "zeta_covariate": zeta, "noise": 0.1},
        "model": {"heads": 1, "rank": size["rank"]},
        "federated": {"strategy": "fedavg", "rounds": size["rounds"], "warmup_rounds": size["rounds"],
                      "local_steps": size["local_steps"], "learning_rate": 1e-3},
    })
    clients = clients_from_config(config)
    eta = step_fraction * stable_learning_rate(clients.truth["kernel"], stack_clients(clients))
    return config.with_updates({"federated.learning_rate": float(eta)}), clients


def evaluate(zeta: float, size: dict, seed: int, step_fraction: float) -> dict:
    """Bound, exhaustive sweep and regret for one heterogeneity level."""
    config, clients = instance(zeta, size, seed, step_fraction)
    start = time.perf_counter()
    path = warmup_path(config, clients)
    optimum = path_optimum(config, clients, path)
    bound = estimate_bound(config, clients, path=path, optimum=optimum)
    bound_time = time.perf_counter() - start
    T = config.federated.rounds
    start = time.perf_counter()
    sweep = excess_risk_by_warmup(config, range(T + 1), clients, optimum=optimum)
    sweep_time = time.perf_counter() - start
    if sweep["diverged"].any():
        raise RuntimeError(f"ζ = {zeta}: a sweep run diverged: {sweep.loc[sweep['diverged'], 'message'].iloc[0]}")
    R = sweep.sort_values("warmup_rounds")["excess_risk"].to_numpy()
    U = bound.U
    best = int(np.argmin(R))
    return {"zeta": zeta, "eta": config.federated.learning_rate, "E": config.federated.local_steps, "T": T,
            "T0_theory": bound.T0_theory, "T0_closed_form": bound.T0_closed_form, "T0_best": best,
            "R_theory": R[bound.T0_theory], "R_best": R[best], "R_fedavg": R[T], "R_zero": R[0],
            "regret": R[bound.T0_theory] / R[best] - 1, "regret_fedavg": R[T] / R[best] - 1,
            "bound_holds": bool(np.all(U >= R * (1 - ROUNDING))), "max_R_over_U": float(np.max(R / U)),
            "U_theory": U[bound.T0_theory], "violated": [c.name.split(":")[0] for c in bound.violated],
            "bound_seconds": bound_time, "sweep_seconds": sweep_time}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller instances (N = 32 samples per client, T = 40)")
    parser.add_argument("--zetas", type=float, nargs="+", default=[0.25, 0.5, 1.0],
                        help="heterogeneity levels ζ_V = ζ_X (default: 0.25 0.5 1.0)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--step-fraction", type=float, default=0.1,
                        help="η as a fraction of the stability limit 2/λ_max at the teacher (default 0.1)")
    args = parser.parse_args(argv)
    size = QUICK if args.quick else FULL
    print(f"planted kernel, ζ_V = ζ_X = ζ, m = {size['num_clients']}, N = {size['samples_per_client']}, "
          f"n = {size['tokens']}, d = {size['dim']}, r = {size['rank']}, T = {size['rounds']}, "
          f"E = {size['local_steps']}, η = {args.step_fraction}·2/λ_max, seed = {args.seed}")
    header = (f"{'ζ':>5s} {'η':>9s} {'T0_theory':>9s} {'T0*':>6s} {'T0_best':>7s} {'R(T0_th)':>10s} "
              f"{'R(T0_best)':>10s} {'regret':>7s} {'FedAvg':>7s} {'U≥R':>4s} {'max R/U':>7s} {'time s':>11s}")
    print(header)
    results = []
    for zeta in args.zetas:
        r = evaluate(zeta, size, args.seed, args.step_fraction)
        results.append(r)
        print(f"{r['zeta']:5.2f} {r['eta']:9.3g} {r['T0_theory']:9d} {r['T0_closed_form']:6.1f} {r['T0_best']:7d} "
              f"{r['R_theory']:10.4g} {r['R_best']:10.4g} {100 * r['regret']:6.2f}% {100 * r['regret_fedavg']:6.1f}% "
              f"{'yes' if r['bound_holds'] else 'NO':>4s} {r['max_R_over_U']:7.3f} "
              f"{r['bound_seconds']:5.1f}+{r['sweep_seconds']:5.1f}", flush=True)
    print("regret = R(T0_theory)/R(T0_best) − 1; FedAvg = R(T)/R(T0_best) − 1; T0* = closed form of the "
          "two-term model; time = bound + exhaustive sweep")
    for r in results:
        if r["violated"]:
            print(f"ζ = {r['zeta']}: assumptions violated on the path: " + "; ".join(r["violated"]))
    worst = max(r["regret"] for r in results)
    print(f"worst regret {100 * worst:.2f}% (goal < 10%); bound U ≥ R at every T0: "
          f"{all(r['bound_holds'] for r in results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
