"""RecUP-FL (Cui et al., "RecUP-FL: Reconciling Utility and Privacy in Federated Learning
via User-configurable Privacy Defense", AsiaCCS 2023): perturb the update so that
attribute-inference models misread the client's sensitive attributes.

The defender models of a model zoo (``gradleak.adversaries.zoo``) read the update w
through ``gradient_features`` (max pooling, §5.4); each FGSM step is
eps' * sign(d CE(S(features(w)), a) / d w), raising the model's loss on the batch's true
attribute a (the most frequent value of ``ctx.attributes[m]`` in the batch). Per
protected attribute m, starting from w^{0'} = g (the clean update), P outer iterations:

  sample Q zoo models with ``ctx.rng``                                     (Alg. 1 line 15)
  meta-train: w^0 = w^{p-1'}; w^q = w^{q-1} + eps/Q sign(grad g_q(S_q(w^{q-1}), a)),
      q = 1 .. Q-1                                                         (Eq. 5)
  meta-test:  w^Q = w^{Q-1} + eps sign(grad CE(S_Q(w^{Q-1}), a))          (Eq. 6)
  w^{p'} = w^{p-1'} + (w^Q - w^{Q-1})                              (Eqs. 7-8, line 21)

then peb = sum_m gamma_m (w^{P,m'} - g) (Eq. 9, Alg. 1 line 23) and the upload is
g + peb. Every element of peb is within P eps sum_m gamma_m of zero. The defenders'
loss g_q is their training loss, cross-entropy. gamma defaults to 1/M per attribute
(the equal weighting of §6.3, Fig. 5; Fig. 4 sweeps gamma_race + gamma_age = 1).

``variant`` selects Appendix E's FGSM baselines instead (single pass as printed,
Eqs. 10-14, ``iterations`` unused): ``one_step`` (one random model, step eps),
``average`` (mean of Q one-step perturbations from w), ``iterative`` (Q chained steps
of eps/Q), ``momentum`` (the same with u_q = mu u_{q-1} + grad / ||grad||_1, step
eps/Q sign(u_q), mu = 0.9).

``per_client`` gives each client one of ``attributes``, client c the (c mod M)-th, with
gamma 1 (§6.4, Fig. 7: "half of the clients select race as their specified attribute and
the other clients select gender"); it needs the client's index (``ctx.client``, set by
the FL run) and leaves ``gamma`` unused.

``zoo_models`` N uses the first N defender models of each attribute's zoo (each has its
own widths and seed, so the first N are a zoo of N), for Fig. 8 (§6.6, zoo sizes 5 .. 20;
with 5 and Q = 5 every iteration samples the same models); null uses them all (20, §5.3).

P = 10 and Q = 5 are the paper's (§5.3); it sweeps epsilon per dataset (5e-6 .. 0.5) and
gives no single value, so the schema's default 0.001 is ours (on a digits LeNet at
round 0 it moves the update by ~0.5% of its norm and takes a Stru-NN adversary on the
ink-mass tercile from 0.79 to below chance).

The upload is g + peb with peb computed from detached copies, so it is differentiable
in g (identity) as an adaptive attacker's ``sample`` needs.

The update is perturbed as one flat vector; each step differentiates only the zoo model
(``FeatureNet.input_gradient``) and scatters the feature gradient to the pooling windows'
maxima, bit-identical to autograd through the whole update. An update then costs P Q
forward and backward passes of zoo models per protected attribute: ~80 ms on one CPU
core with the paper's zoo (widths 128 .. 2048), bound by reading their weights
(``benchmarks/recupfl_cost.py``). ``many`` perturbs several updates at once, each drawing
its models with its own generator as if alone; at each step the rows that drew the same
model pass through it as one batch (one read of its weights), which changes only the
rounding (one matrix product for the group). The attribute track makes its uploads 100 at
a time (a RecUP-FL attribute job of the default 84-90 -> 44-49 s;
docs/decisions/0082-recupfl-uploads-together.md), and EOT draws for all its stacked
victims at once (``adaptive_many``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from gradleak.adversaries.features import gradient_features
from gradleak.adversaries.neural import FeatureNet
from gradleak.adversaries.zoo import ModelZoo
from gradleak.config import ConfigError
from gradleak.defenses.base import Defense, DefenseContext, register
from gradleak.needs import Need
from gradleak.types import Update

VARIANTS = ("meta", "one_step", "average", "iterative", "momentum")


def flatten(update: Update) -> torch.Tensor:
    """The update's tensors flattened and concatenated in insertion order (as
    ``gradient_features`` reads them)."""
    return torch.cat([t.reshape(-1) for t in update.values()])


def unflatten(flat: torch.Tensor, like: Update) -> list[torch.Tensor]:
    """``flat`` split into views shaped like the tensors of ``like``."""
    parts = flat.split([t.numel() for t in like.values()])
    return [part.view(t.shape) for part, t in zip(parts, like.values())]


def loss_gradients(flats: torch.Tensor, models: Sequence[FeatureNet], labels: torch.Tensor,
                   size: int) -> torch.Tensor:
    """(N, D): row i is d CE(models[i](pool(flats[i])), labels[i]) / d flats[i].

    Adaptive max pooling passes each feature's gradient to its window's maximum (summed
    where two windows share one), so only the model is differentiated, with respect to
    its input; the scatter is the pooling's backward pass, exactly. Rows that share a
    model run through it together (one read of its weights)."""
    features, index = F.adaptive_max_pool1d(flats[:, None], size, return_indices=True)
    features, index = features[:, 0], index[:, 0]
    grads = torch.zeros_like(features)
    for model, rows in _rows_by_model(models):
        rows = torch.tensor(rows)
        grads[rows] = model.input_gradient(features[rows].to(model.center),
                                           labels[rows]).to(grads)
    return torch.zeros_like(flats).scatter_add_(1, index, grads)


def loss_gradient(flat: torch.Tensor, model: FeatureNet, label: int, size: int
                  ) -> torch.Tensor:
    """:func:`loss_gradients` of one flattened update ``flat``."""
    return loss_gradients(flat[None], [model], torch.tensor([label]), size)[0]


def _rows_by_model(models: Sequence[FeatureNet]) -> list[tuple[FeatureNet, list[int]]]:
    """The distinct models of ``models`` (first-appearance order), each with its rows."""
    groups: dict[int, tuple[FeatureNet, list[int]]] = {}
    for row, model in enumerate(models):
        groups.setdefault(id(model), (model, []))[1].append(row)
    return list(groups.values())


def fgsm_step(w: torch.Tensor, direction: torch.Tensor, step: float) -> torch.Tensor:
    """``w + step * sign(direction)``."""
    return w + step * direction.sign()


@register("recupfl")
class RecUPFL(Defense):
    needs = {"zoo": Need("model_zoo")}

    @classmethod
    def check_config(cls, params: Mapping[str, Any], config: Mapping, where: str) -> None:
        """``zoo_models`` and the Q models sampled per iteration (``models``) at most the zoo
        the pipeline trains (``attribute.zoo_size``)."""
        zoo = config["attribute"]["zoo_size"]
        if (params.get("zoo_models") or 0) > zoo:
            raise ConfigError(f"invalid config: '{where}.zoo_models': {params['zoo_models']} "
                              f"models, but the zoo holds 'attribute.zoo_size' {zoo}; expected "
                              f"at most {zoo}", key=f"{where}.zoo_models")
        held = min(zoo, params.get("zoo_models") or zoo)
        sampled = 1 if params.get("variant") == "one_step" else params.get("models", 0)
        if sampled > held:
            raise ConfigError(f"invalid config: '{where}.models': RecUP-FL samples {sampled} "
                              f"zoo models per iteration, but it uses {held} ('attribute."
                              f"zoo_size' {zoo}); expected at most {held}", key=f"{where}.models")

    def __init__(self, *, zoo: ModelZoo, epsilon: float, iterations: int, models: int,
                 attributes: Sequence[str] | None, gamma: Sequence[float] | None,
                 variant: str, momentum: float, zoo_models: int | None,
                 per_client: bool) -> None:
        if not isinstance(zoo, ModelZoo):
            raise ValueError(f"recupfl needs zoo=, a ModelZoo (gradleak.adversaries.load_zoo), "
                             f"got {type(zoo).__name__}")
        if not epsilon >= 0:
            raise ValueError(f"recupfl epsilon must be >= 0, got {epsilon}")
        if variant not in VARIANTS:
            raise ValueError(f"recupfl variant must be one of {list(VARIANTS)}, got {variant!r}")
        if int(iterations) < 1:
            raise ValueError(f"recupfl iterations (P) must be >= 1, got {iterations}")
        lowest = 2 if variant == "meta" else 1
        if int(models) < lowest:
            raise ValueError(f"recupfl models (Q) must be >= {lowest} for variant {variant!r} "
                             f"(meta-train uses Q-1 models, meta-test one more), got {models}")
        if not 0 <= momentum:
            raise ValueError(f"recupfl momentum must be >= 0, got {momentum}")
        if zoo_models is not None:
            zoo = self.first_models(zoo, zoo_models)
        self.zoo, self.epsilon, self.iterations, self.models = zoo, float(epsilon), \
            int(iterations), int(models)
        self.attributes, self.gamma, self.variant, self.momentum = attributes, gamma, variant, \
            float(momentum)
        if isinstance(attributes, str):
            raise ValueError(f"recupfl attributes must be a list of attribute names or null, "
                             f"got the string {attributes!r}; write [{attributes!r}]")
        self.protected = list(zoo.attributes if attributes is None else attributes)
        unknown = [a for a in self.protected if a not in zoo.models]
        if unknown or not self.protected or len(set(self.protected)) < len(self.protected):
            raise ValueError(f"recupfl attributes {self.protected} must be a non-empty list of "
                             f"distinct attributes of the zoo {zoo.attributes}; "
                             f"unknown: {unknown}")
        weights = [1 / len(self.protected)] * len(self.protected) if gamma is None \
            else [float(v) for v in gamma]
        if len(weights) != len(self.protected) or min(weights) < 0:
            raise ValueError(f"recupfl gamma must hold one weight >= 0 per protected attribute "
                             f"{self.protected}, got {gamma}")
        self.weights = dict(zip(self.protected, weights))
        self.per_client = bool(per_client)
        for attribute in self.protected:
            needed = 1 if variant == "one_step" else self.models
            if len(zoo.models[attribute]) < needed:
                raise ValueError(f"recupfl samples {needed} models per iteration but the zoo "
                                 f"has {len(zoo.models[attribute])} for {attribute!r}")
            for model in zoo.models[attribute]:
                if not isinstance(model, FeatureNet):
                    raise ValueError(f"recupfl zoo models must be FeatureNets (train_zoo, "
                                     f"load_zoo), got a {type(model).__name__} for "
                                     f"{attribute!r}")
                if model.features != zoo.feature_size:
                    raise ValueError(f"recupfl zoo feature size is {zoo.feature_size} but a "
                                     f"{attribute!r} model takes {model.features} features")

    @staticmethod
    def first_models(zoo: ModelZoo, count: int) -> ModelZoo:
        """``zoo`` cut to the first ``count`` defender models of each attribute."""
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"recupfl zoo_models must be a positive integer or null, "
                             f"got {count!r}")
        short = {a: len(models) for a, models in zoo.models.items() if len(models) < count}
        if short:
            raise ValueError(f"recupfl zoo_models is {count} but the zoo holds fewer models: "
                             f"{short}; expected at most attribute.zoo_size")
        return ModelZoo(zoo.feature_size, dict(zoo.classes),
                        {a: list(models[:count]) for a, models in zoo.models.items()})

    # -- one attribute -------------------------------------------------------------------

    def batch_label(self, ctx: DefenseContext, attribute: str) -> int:
        """The batch's value of ``attribute``: its most frequent value (smallest on ties)."""
        if ctx.attributes is None or attribute not in ctx.attributes:
            have = None if ctx.attributes is None else sorted(ctx.attributes)
            raise ValueError(f"recupfl protects attribute {attribute!r} but the DefenseContext "
                             f"has attributes {have}; expected ctx.attributes[{attribute!r}], "
                             f"a (B,) int64 tensor of the batch's values")
        values = ctx.attributes[attribute].detach().cpu().long()
        classes = self.zoo.classes[attribute]
        if len(values) == 0 or int(values.min()) < 0 or int(values.max()) >= classes:
            raise ValueError(f"recupfl attribute {attribute!r} values must be integers in "
                             f"[0, {classes}), got {values.tolist()}")
        return int(torch.bincount(values, minlength=classes).argmax())

    def sample(self, trial: Update, ctx: DefenseContext) -> Update:
        """An adaptive attacker's (EOT) draw: :meth:`samples` of one trial gradient."""
        return self.samples([trial], [ctx])[0]

    def samples(self, trials: Sequence[Update], ctxs: Sequence[DefenseContext]
                ) -> list[Update]:
        """One draw per trial gradient, trial i drawing with ``ctxs[i].rng``. The attacker
        does not know the clients' attributes: each protected one a context lacks is the
        zoo's majority reading of its trial gradient."""
        with torch.no_grad():
            features = torch.stack([gradient_features(Update(t).detached(),
                                                      self.zoo.feature_size) for t in trials])
            readings = {a: [int(torch.bincount(votes).argmax()) for votes in  # ties: smallest
                            torch.stack([m(features).argmax(1) for m in self.zoo.models[a]], 1)]
                        for a in self.protected}
        contexts = []
        for i, (trial, ctx) in enumerate(zip(trials, ctxs)):
            attributes = dict(ctx.attributes or {})
            for attribute in (a for a in self.protected if a not in attributes):
                attributes[attribute] = torch.full((ctx.x.shape[0],), readings[attribute][i])
            contexts.append(DefenseContext(ctx.model, ctx.x, ctx.y, ctx.rng, gradient=trial,
                                           attributes=attributes))
        return self.many(contexts)

    def adaptive_many(self, trials: Sequence[Update], ctxs: Sequence[DefenseContext],
                      received: Sequence[Update]) -> list[Update]:
        """EOT's draws for several problems at once (:meth:`samples`)."""
        return self.samples(trials, ctxs)

    def sample_models(self, attribute: str, count: int, rng: torch.Generator
                      ) -> list[FeatureNet]:
        """``count`` distinct zoo models of ``attribute``, drawn with ``rng``."""
        pool = self.zoo.models[attribute]
        return [pool[int(i)] for i in torch.randperm(len(pool), generator=rng)[:count]]

    def _draw(self, attribute: str, count: int, rngs: Sequence[torch.Generator]
              ) -> list[list[FeatureNet]]:
        """[q][i]: the q-th of ``count`` models row i draws with ``rngs[i]``."""
        return [list(m) for m in zip(*(self.sample_models(attribute, count, r) for r in rngs))]

    def _grad(self, w: torch.Tensor, models: Sequence[FeatureNet], labels: torch.Tensor
              ) -> torch.Tensor:
        return loss_gradients(w, models, labels, self.zoo.feature_size)

    def meta_step(self, w: torch.Tensor, models: Sequence[Sequence[FeatureNet]],
                  labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(w^{Q-1}, w^Q) of the flattened updates ``w`` (N, D), row i through the models
        ``models[q][i]``: meta-train over q < Q-1 (Eq. 5), meta-test on the last (Eq. 6)."""
        step = self.epsilon / len(models)
        for row_models in models[:-1]:
            w = fgsm_step(w, self._grad(w, row_models, labels), step)
        return w, fgsm_step(w, self._grad(w, models[-1], labels), self.epsilon)

    def meta(self, g: torch.Tensor, attribute: str, labels: torch.Tensor,
             rngs: Sequence[torch.Generator]) -> torch.Tensor:
        """w^{P'} of Eq. 8 for each row of the flattened updates ``g`` (N, D): P
        meta-train/meta-test iterations, row i drawing its models with ``rngs[i]``."""
        w = g
        for _ in range(self.iterations):
            before, after = self.meta_step(w, self._draw(attribute, self.models, rngs), labels)
            w = w + (after - before)
        return w

    def appendix_e(self, g: torch.Tensor, attribute: str, labels: torch.Tensor,
                   rngs: Sequence[torch.Generator]) -> torch.Tensor:
        """The perturbed flattened updates (N, D) of an Appendix E variant (Eqs. 10-14)."""
        if self.variant == "one_step":
            (models,) = self._draw(attribute, 1, rngs)
            return fgsm_step(g, self._grad(g, models, labels), self.epsilon)
        drawn = self._draw(attribute, self.models, rngs)
        if self.variant == "average":
            signs = [self._grad(g, models, labels).sign() for models in drawn]
            return g + self.epsilon * sum(signs) / len(drawn)
        w, velocity = g, torch.zeros_like(g)
        for models in drawn:
            grad = self._grad(w, models, labels)
            if self.variant == "momentum":  # Eq. 13: u_q = mu u_{q-1} + grad / ||grad||_1
                l1 = grad.abs().sum(dim=1, keepdim=True)
                velocity = self.momentum * velocity + grad / l1.masked_fill(l1 == 0, 1.0)
                grad = velocity
            w = fgsm_step(w, grad, self.epsilon / len(drawn))  # Eqs. 12, 14
        return w

    # -- the defense ----------------------------------------------------------------------

    def client_weights(self, ctx: DefenseContext) -> dict[str, float]:
        """gamma per protected attribute for this upload: the configured ones, or with
        ``per_client`` 1 for the client's own attribute and 0 for the others."""
        if not self.per_client:
            return self.weights
        if ctx.client is None:
            raise ValueError("recupfl per_client gives each client its own attribute, but this "
                             "upload has no client index (DefenseContext client=None: made "
                             "outside an FL run); expected per_client: false here")
        own = self.protected[int(ctx.client) % len(self.protected)]
        return {a: float(a == own) for a in self.protected}

    def __call__(self, ctx: DefenseContext) -> Update:
        return self.many([ctx])[0]

    def many(self, ctxs: Sequence[DefenseContext]) -> list[Update]:
        """The uploads of several client batches, each drawing with its own ``ctx.rng`` as
        if alone; the zoo passes of rows that drew the same model run together."""
        gs = [ctx.true_gradient() for ctx in ctxs]
        labels = {a: torch.tensor([self.batch_label(ctx, a) for ctx in ctxs])
                  for a in self.protected}
        weights = [self.client_weights(ctx) for ctx in ctxs]
        if self.epsilon == 0:
            return [Update(g) for g in gs]
        perturb = self.meta if self.variant == "meta" else self.appendix_e
        with torch.no_grad():
            clean = torch.stack([flatten(g) for g in gs])
            peb = torch.zeros_like(clean)
            for attribute in self.protected:
                rows = [i for i, w in enumerate(weights) if w[attribute] != 0]
                if not rows:
                    continue
                w = perturb(clean[rows], attribute, labels[attribute][rows],
                            [ctxs[i].rng for i in rows])
                gamma = torch.tensor([weights[i][attribute] for i in rows])[:, None]
                peb[rows] += gamma * (w - clean[rows])
        return [Update(g) if not any(w.values()) else
                Update({k: g[k] + p for k, p in zip(g, unflatten(peb[i], g))}, **g.info)
                for i, (g, w) in enumerate(zip(gs, weights))]
