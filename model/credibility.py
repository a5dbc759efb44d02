"""Reporter credibility: how far what an owner reports of its collaborators agrees with what others report of them.

Where owners report their own tasks' outcomes (the event's ``reporter`` names the owner), a dishonest owner can lie:
report a fellow colluder's task a success (ballot-stuffing) or an honest device's computation failed (bad-mouthing).
What owners reported is kept per pair (:data:`model.evidence.REPORTED`), apart from what monitors saw, and weighed by
its owner's credibility wherever a collaborator's (and the population's) evidence is read:

    for each pair i -> j, the others' evidence of j: what monitors saw of j plus every other owner's reports of j,
        weighed by their credibility;
    honest: i's reports of each j follow the others' posterior predictive of j (a Beta-binomial from their counts
        under a uniform prior); a liar: i's reports follow one rate of its own whoever it reports of (uniform prior
        on it), per rate: P(tr), P(com | tr), and the graded reliability where the reports carry no flags;
    log-likelihood ratio L_i: honest against liar over i's pairs, on the rate where it is lowest (a bad-mouther reports
        the transmissions true and the computations failed: it is judged on the computations);
    c_i = min(1, P(honest | i's reports) / P(honest)) = min(1, 1 / ((1 - pi) + pi exp(-L_i))), pi ``liar_prior``,

starting from c = 1 and refined ``rounds`` times. A reporter with few reports, or reports like the others' of the same
collaborators, keeps its full weight; a bad-mouther, whose reports of honest devices say failed where most others say
succeeded, loses it. An honest owner that happened to pick poor collaborators agrees with the others about them.
Everything is read from the sums as of one slot, owners' reports at their own longest memory
(:data:`model.evidence.JUDGING_MEMORY`: a liar lies all along, and ~20 reports an owner makes in 100 slots of the paper's
setting judge it far better than the ~10 the model's longest memory keeps), so the offline path and the scorer (every
piece of a slot holds every owner-reported pair) weigh alike, and in the paper's setting, where a monitor sees every
task, nothing is weighed and nothing changes.

What the weighing takes out is not thrown away: :func:`discredited` keeps it per device, and the head reads it
(:func:`model.evidence.discredited_block`): a device that liars praise is likely one of theirs, one they blame likely
honest, and one whose own reports are not believed is likely a liar, whose service may be no better than its word
(the head learns from the training period how far it is). What it cannot see: a clique of liars that reports only
about its own members, which then make up most of what is reported of them and agree with one another (ballot-stuffers
that offload only to one another, where no other owner's reports contradict theirs); a monitor's share of the reports
anchors them.

Glossary: pi ``liar_prior``; c the credibility; L the log-likelihood ratio.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import betaln

from model.evidence import COM, DISCREDITED, F, N, TR, W


@dataclass(frozen=True)
class CredibilityConfig:
    liar_prior: float = 0.1  # pi: the prior share of reporters that lie
    rounds: int = 3  # refinements of the credibilities, each weighing the others' evidence by the last

    def __post_init__(self) -> None:
        if not 0 < self.liar_prior < 1:
            raise ValueError(f"CredibilityConfig.liar_prior: must be in (0, 1) (got {self.liar_prior!r})")
        if self.rounds < 1:
            raise ValueError(f"CredibilityConfig.rounds: must be >= 1 (got {self.rounds!r})")


def _rates(sums: np.ndarray) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    """(successes, trials) of each rate in evidence sums (r, C): P(tr), P(com | tr), and the graded reliability of
    tasks without flags (trials 0 where any task had them)."""
    graded = sums[:, F] <= 0
    return ((sums[:, TR], sums[:, F]), (sums[:, COM], sums[:, TR]),
            (np.where(graded, sums[:, W], 0.0), np.where(graded, sums[:, N], 0.0)))


def agreement(owner: np.ndarray, reports: np.ndarray, others: np.ndarray) -> np.ndarray:
    """(owners, 3) each owner's log-likelihood ratio per rate: its reports (r, C) of its pairs (``owner`` (r,) its
    index) under the others' evidence of each pair's collaborator (r, C), each report predicted by a Beta-binomial
    from the others' counts (a uniform prior), against one rate of its own for every pair (a uniform prior on it).
    The binomial coefficients of the two likelihoods cancel."""
    out = np.zeros((owner.max() + 1, 3))
    for k, ((hits, trials), (other_hits, other_trials)) in enumerate(zip(_rates(reports), _rates(others))):
        hits = np.clip(hits, 0.0, trials)
        a, b = other_hits + 1.0, np.maximum(other_trials - other_hits, 0.0) + 1.0
        honest = np.bincount(owner, weights=betaln(hits + a, trials - hits + b) - betaln(a, b), minlength=len(out))
        own_hits = np.bincount(owner, weights=hits, minlength=len(out))
        own_trials = np.bincount(owner, weights=trials, minlength=len(out))
        out[:, k] = honest - betaln(own_hits + 1.0, own_trials - own_hits + 1.0)
    return out


def believed_share(reported_share: np.ndarray, credibility: np.ndarray) -> np.ndarray:
    """(k,) how much of each edge's tasks is believed: what monitors saw in full, the share its owner reported
    itself (``reported_share`` (k,)) at the owner's ``credibility`` (k,)."""
    return 1.0 - reported_share * (1.0 - credibility)


def discredited(reports: np.ndarray, credibility: np.ndarray, collaborator: np.ndarray, owner: np.ndarray,
                n: int) -> np.ndarray:
    """(n, L, 4) what the credibility did not let in, per device (:data:`model.evidence.DISCREDITED`): the tasks owners
    reported of it as collaborator times one less each owner's credibility, and their reported T_col so weighed; the
    tasks it reported as an owner so weighed, and all it reported.

    reports: (r, L, C) what each owner-reported pair's owner reported of it; credibility: (r,) that owner's;
    collaborator, owner: (r,) the pair's collaborator's and owner's rows among the n devices (-1: not among them)."""
    doubted = reports[..., [N, W]] * (1.0 - credibility)[:, None, None]  # (r, L, 2)
    from_owner = np.stack([doubted[..., 0], reports[..., N]], axis=-1)  # (r, L, 2)
    out = np.zeros((n, reports.shape[1], len(DISCREDITED)))
    for rows, sums, channels in ((collaborator, doubted, slice(0, 2)), (owner, from_owner, slice(2, 4))):
        held = rows >= 0
        np.add.at(out[..., channels], rows[held], sums[held])
    return out


def credibility(owners: np.ndarray, collaborators: np.ndarray, reports: np.ndarray, monitored: np.ndarray,
                config: CredibilityConfig = CredibilityConfig()) -> np.ndarray:
    """(r,) the credibility in [0, 1] of the owner of each owner-reported pair (see the module's docstring).

    owners, collaborators: (r,) keys of each pair's owner and collaborator; reports: (r, C) what the owner reported of
    it; monitored: (r, C) what monitors saw of its collaborator (its collaborator role's evidence); all at one
    memory."""
    if not len(owners):
        return np.zeros(0)
    _, owner = np.unique(owners, return_inverse=True)
    collaborator_keys, collaborator = np.unique(collaborators, return_inverse=True)
    base = np.zeros((len(collaborator_keys), reports.shape[1]))
    base[collaborator] = monitored
    weight = np.ones(len(owners))
    prior = config.liar_prior
    for _ in range(config.rounds):
        weighed = reports * weight[:, None]
        consensus = base.copy()
        np.add.at(consensus, collaborator, weighed)
        ratio = agreement(owner, reports, consensus[collaborator] - weighed)
        with np.errstate(over="ignore"):  # judged on the rate it agrees with least (a liar may tell the rest true)
            weight = np.minimum(1.0, 1.0 / ((1 - prior) + prior * np.exp(-ratio.min(axis=1))))[owner]
    return weight
