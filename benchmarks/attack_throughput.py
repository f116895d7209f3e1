"""Iterations per second of Inverting Gradients: gradleak's vectorised engine, its per-victim
loop, and the breaching library (Geiping et al.'s own implementation).

Inverting Gradients (Geiping et al., NeurIPS 2020, Eq. 4) on LeNet and ResNet-18
(gradleak.models.build, 3x32x32 inputs, 10 classes) for 1, 8 and 32 problems
(victims x restarts), on the CPU and on CUDA when present. The per-victim loop is the
engine one problem at a time (``reconstruct_all(..., engine="loop")``: victim by victim,
each trial gradient by autograd on the model); the vectorised path stacks all victims at
once (``engine="stacked"``: the problems on the batch dimension,
``attacks.stacked_gradients``).
An iteration is one Adam step of one problem, so iterations/s = problems x
iterations / seconds. After a one-iteration warm-up of each path, ``--repeats``
timed runs rotate the order of the paths so that machine noise hits all of them;
medians are reported with the min and max, with process CPU time beside wall time
(robust to other processes on a shared machine).

The breaching column (``pip install gradleak[bench]``: breaching 0.1.2; absent, with a
printed reason, when it cannot be imported) runs breaching's ``attack=invertinggradients``
(cosine similarity, TV, Adam on the gradient sign, lr 0.1 with steps at 3/8, 5/8, 7/8,
box [0, 1], N(0, 1) starts, best restart) on the same observations, model object,
iterations and restarts: per victim, ``prepare_attack`` and ``reconstruct``, whose
restarts run one after the other (timed with them: building the attacker, its copy of the
model, its per-step best-iterate copy and the scoring of each restart). Choices that make
it the same problem: normalisation mean 0 / std 1 (gradleak's images are the inputs in
[0, 1]), TV weight ``--tv`` (gradleak's lambda_TV 1e-4 instead of breaching's 0.2; both
weigh a mean of |dx| + |dy|, breaching's with zero padding at the border), the labels
known, and no buffers sent, so that breaching attacks in training mode with batch
statistics as the client computed the gradient. On the CPU victim v starts from the
images gradleak's seed v draws (breaching's global generator seeded v). Compare the three
paths at 1 victim x R restarts (``--sizes R --restarts R``), breaching's unit of work.

BatchNorm (ResNet-18): the models stay in training mode, as the client computed
the observed gradient; every path normalises with each problem's own batch statistics
(the vectorised path per stacked problem, without writing the running statistics).

Against the machine: ``{path}_gflops`` is each path's achieved GFLOP/s, the FLOPs of one
iteration (forward, backward with its graph, the matching loss and the second backward,
counted by ``torch.utils.flop_counter.FlopCounterMode`` as a run of two iterations less a
run of one, so that the set-up and the final scoring cancel) x iterations / median wall
seconds; ``matmul_gflops`` the same process's float32 matmul rate on the same threads
(the best of five 2048x2048 products), and ``{path}_peak_share`` the ratio of the two.

Sanity check: ``{path}_gradient_distance`` is the cosine distance between the gradient
at each path's reconstruction (last timed run) and the observed one, averaged over
victims; after the same iterations the paths should be close (with ``--tv 0`` on the
CPU, the same trajectory up to rounding).

    python benchmarks/attack_throughput.py --threads 1 [--models lenet resnet18]
        [--sizes 1 8 32] [--restarts 1] [--iterations lenet=20 resnet18=2]
        [--repeats 3] [--tv 1e-4] [--devices cpu cuda] [--out FILE.csv]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import statistics
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import torch

from gradleak import attacks, models
from gradleak.types import Update

DEFAULT_ITERATIONS = {"lenet": 20, "resnet18": 2}
Runner = Callable[[list[attacks.Observation], dict], list[torch.Tensor]]


def iterations_per_model(spec: str) -> tuple[str, int]:
    """Parse ``MODEL=N`` (e.g. ``resnet18=2``)."""
    name, sep, count = spec.partition("=")
    if not sep or not count.isdigit() or int(count) < 1:
        raise argparse.ArgumentTypeError(f"expected MODEL=N with N >= 1, got {spec!r}")
    return name, int(count)


def observations(model: torch.nn.Module, victims: int, batch: int, device: torch.device,
                 seed: int) -> list[attacks.Observation]:
    """``victims`` client updates of random images (uniform in [0, 1]) and labels."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(victims):
        x = torch.rand(batch, *model.input_shape, generator=gen).to(device)
        y = torch.randint(0, 10, (batch,), generator=gen).to(device)
        observed = Update.of(model, x, y).detached()
        out.append(attacks.Observation(model=model, gradient=observed, batch_size=batch,
                                       labels=y))
    return out


def per_victim(observed: list[attacks.Observation], params: dict) -> list[torch.Tensor]:
    run = attacks.reconstruct_all(attacks.build("inverting_gradients", seed=0, **params),
                                  observed, engine="loop")
    return [r.images for r in run]


def vectorised(observed: list[attacks.Observation], params: dict) -> list[torch.Tensor]:
    run = attacks.reconstruct_all(attacks.build("inverting_gradients", seed=0, **params),
                                  observed, engine="stacked")
    return [r.images for r in run]


def breaching_path() -> Runner | None:
    """breaching's Inverting Gradients as a path, or None (with the reason printed)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.jit.script's deprecation, at import
            import breaching
    except Exception as error:  # an optional comparison: report and go on without it
        print(f"no breaching column: cannot import breaching ({type(error).__name__}: {error});"
              " pip install -e '.[bench]'")
        return None
    overrides = ["case=1_single_image_small", "attack=invertinggradients",
                 "case.data.mean=[0,0,0]", "case.data.std=[1,1,1]"]
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")  # hydra's version_base notice
        cfg = breaching.get_config(overrides=overrides)  # prints the use case
    logging.getLogger("breaching").setLevel(logging.WARNING)

    def run(observed: list[attacks.Observation], params: dict) -> list[torch.Tensor]:
        # callback = iterations: one progress line at the first and last step, not logged
        cfg.attack.optim.max_iterations = cfg.attack.optim.callback = params["iterations"]
        cfg.attack.restarts.num_trials = params["restarts"]
        cfg.attack.regularization.total_variation.scale = params["tv"]
        out = []
        for v, obs in enumerate(observed):
            torch.manual_seed(v)  # breaching draws its starts from the global generator
            cfg.case.data.shape, cfg.case.data.classes = list(obs.input_shape), obs.num_classes
            attacker = breaching.attacks.prepare_attack(
                obs.model, torch.nn.CrossEntropyLoss(), cfg.attack,
                dict(device=obs.device, dtype=torch.float))
            payload = dict(parameters=[p.detach() for p in obs.model.parameters()],
                           buffers=None, metadata=cfg.case.data)
            shared = dict(gradients=obs.target_gradient(), buffers=None,
                          metadata=dict(num_data_points=obs.batch_size, labels=obs.labels,
                                        local_hyperparams=None))
            data, _ = attacker.reconstruct([payload], [shared], {}, dryrun=False)
            out.append(data["data"].detach().clamp(0, 1))
        return out

    return run


def gradient_distance(observed: list[attacks.Observation], images: list[torch.Tensor]) -> float:
    """Mean over victims of 1 - cos(gradient at the reconstruction, observed gradient), all
    layers as one vector."""
    def flat(gradients) -> torch.Tensor:
        return torch.cat([g.detach().flatten() for g in gradients])

    return statistics.mean(
        1 - float(torch.nn.functional.cosine_similarity(
            flat(Update.of(obs.model, x, obs.labels).values()), flat(obs.target_gradient()),
            dim=0))
        for obs, x in zip(observed, images))


def grouped_conv_backward_flop(grad_out_shape, x_shape, w_shape, bias, stride, padding,
                               dilation, transposed, output_padding, groups, output_mask,
                               out_shape=None, **_) -> int:
    """torch's FLOP count of ``convolution_backward`` with the weight gradient's divided by
    ``groups``: torch 2.14 counts a grouped convolution's weight gradient as if each group
    met every other (8x at 8 groups, checked against the groups one at a time); its input
    gradient's count is right."""
    from torch.utils.flop_counter import conv_backward_flop

    shapes = conv_backward_flop.__wrapped__  # the formula on shapes, under its wrapper
    args = (grad_out_shape, x_shape, w_shape, bias, stride, padding, dilation, transposed,
            output_padding, groups)
    data = shapes(*args, [output_mask[0], False, False], out_shape=out_shape)
    weight = shapes(*args, [False, output_mask[1], False], out_shape=out_shape)
    return data + weight // groups


def flops_per_iteration(run: Runner, observed: list[attacks.Observation], params: dict
                        ) -> float:
    """FLOPs of one iteration of ``run`` over all problems: a run of two iterations less a
    run of one (torch's FLOP counter: matmuls and convolutions, forward and backward, the
    grouped convolutions' weight gradients counted per group)."""
    from torch.utils.flop_counter import FlopCounterMode

    counts = []
    fixed = {torch.ops.aten.convolution_backward: grouped_conv_backward_flop}
    for iterations in (1, 2):
        with FlopCounterMode(display=False, custom_mapping=fixed) as counter:
            run(observed, {**params, "iterations": iterations})
        counts.append(counter.get_total_flops())
    return float(counts[1] - counts[0])


def matmul_gflops(device: torch.device, n: int = 2048, repeats: int = 5) -> float:
    """The best float32 rate of an n x n matmul on ``device``, in GFLOP/s."""
    a, b = (torch.rand(n, n, device=device) for _ in range(2))
    best = float("inf")
    for _ in range(repeats + 1):  # the first warms up
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return 2 * n ** 3 / best / 1e9


def timed(run: Runner, observed: list[attacks.Observation], params: dict,
          device: torch.device) -> tuple[float, float, list[torch.Tensor]]:
    """(wall seconds, process CPU seconds, reconstructions) of one run."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    wall, cpu = time.perf_counter(), time.process_time()
    images = run(observed, params)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - wall, time.process_time() - cpu, images


def measure(paths: dict[str, Runner], observed: list[attacks.Observation], params: dict,
            device: torch.device, repeats: int
            ) -> tuple[dict[str, list[tuple[float, float]]], dict[str, list[torch.Tensor]]]:
    """Timings of every path, in an order rotated each repeat, after a one-iteration
    warm-up run of each; and each path's reconstructions from its last run."""
    for run in paths.values():
        run(observed, {**params, "iterations": 1})
    names = list(paths)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    images: dict[str, list[torch.Tensor]] = {}
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            wall, cpu, images[name] = timed(paths[name], observed, params, device)
            times[name].append((wall, cpu))
    return times, images


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["lenet", "resnet18"])
    parser.add_argument("--sizes", nargs="+", type=int, default=[1, 8, 32],
                        help="problems = victims x restarts")
    parser.add_argument("--restarts", type=int, default=1, help="restarts per victim")
    parser.add_argument("--iterations", nargs="+", type=iterations_per_model, default=[],
                        help=f"MODEL=N Adam steps per run (default {DEFAULT_ITERATIONS})")
    parser.add_argument("--batch", type=int, default=1, help="images per client update")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tv", type=float, default=1e-4,
                        help="TV weight of both implementations (gradleak's default)")
    parser.add_argument("--devices", nargs="+", choices=["cpu", "cuda"], default=["cpu", "cuda"],
                        help="where to run (cuda only where present)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/attack_throughput.csv"))
    args = parser.parse_args()
    bad = [s for s in args.sizes if s < 1 or s % args.restarts]
    if args.restarts < 1 or bad:
        raise SystemExit(f"sizes must be positive multiples of --restarts {args.restarts}; "
                         f"got {bad or args.restarts}")
    iterations = {**DEFAULT_ITERATIONS, **dict(args.iterations)}
    missing = sorted(set(args.models) - set(iterations))
    if missing:
        raise SystemExit(f"no iteration count for {missing}: pass --iterations MODEL=N")
    torch.set_num_threads(args.threads)
    paths: dict[str, Runner] = {"loop": per_victim, "vectorised": vectorised}
    if (other := breaching_path()) is not None:
        paths["breaching"] = other
    devices = [torch.device(d) for d in args.devices
               if d == "cpu" or torch.cuda.is_available()]
    rows = []
    for device in devices:
        peak = matmul_gflops(device)
        for name in args.models:
            torch.manual_seed(0)
            model = models.build(name, 3, 10, 32).to(device)
            params = {"iterations": iterations[name], "restarts": args.restarts, "tv": args.tv}
            for size in args.sizes:
                victims = size // args.restarts
                observed = observations(model, victims, args.batch, device, seed=size)
                times, images = measure(paths, observed, params, device, args.repeats)
                row = {"device": device.type, "model": name, "problems": size,
                       "victims": victims, "restarts": args.restarts, "batch": args.batch,
                       "iterations": params["iterations"], "threads": args.threads,
                       "repeats": args.repeats}
                work = size * params["iterations"]
                for path, runs in times.items():
                    walls, cpus = zip(*runs)
                    for kind, values in (("", walls), ("cpu_", cpus)):
                        median = statistics.median(values)
                        row[f"{path}_{kind}seconds"] = median
                        row[f"{path}_{kind}seconds_min"] = min(values)
                        row[f"{path}_{kind}seconds_max"] = max(values)
                        row[f"{path}_{kind}iterations_per_s"] = work / median
                    row[f"{path}_gradient_distance"] = gradient_distance(observed, images[path])
                    flops = flops_per_iteration(paths[path], observed, params)
                    row[f"{path}_gflops"] = flops * params["iterations"] / row[
                        f"{path}_seconds"] / 1e9
                    row[f"{path}_peak_share"] = row[f"{path}_gflops"] / peak
                row["matmul_gflops"] = peak
                # throughput ratios, from the median times
                pairs = [("speedup", "vectorised", "loop")] + [
                    (f"{fast}_vs_breaching", fast, "breaching")
                    for fast in ("vectorised", "loop") if "breaching" in times]
                for label, fast, slow in pairs:
                    row[label] = row[f"{slow}_seconds"] / row[f"{fast}_seconds"]
                    row[f"cpu_{label}"] = row[f"{slow}_cpu_seconds"] / row[f"{fast}_cpu_seconds"]
                rows.append(row)
                rates = ", ".join(f"{path} {row[f'{path}_iterations_per_s']:.2f} "
                                  f"({row[f'{path}_cpu_iterations_per_s']:.2f} CPU)"
                                  for path in times)
                print(f"{device.type:4} {name:8} {size:3} problems, it/s: {rates}", flush=True)
    table = pd.DataFrame(rows).sort_values(["device", "model", "problems"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out, index=False, float_format="%.6g", lineterminator="\n")
    ratios = [c for c in table.columns if c.endswith(("speedup", "_vs_breaching"))]
    print(table[["device", "model", "problems", *(f"{p}_iterations_per_s" for p in paths),
                 *ratios, *(f"{p}_peak_share" for p in paths), "matmul_gflops"]
                ].to_string(index=False))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
