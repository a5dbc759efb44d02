"""What the job's online recalibration does to the trust it publishes, on a recorded log's test period.

``trustbeam evaluate``'s ``bm_online`` refits the level shift on every test edge. The job's publisher
(:class:`model.publisher.SlotPublisher`) meets fewer outcomes: a slot's outcomes are set only against the forecasts it
published the slot before, i.e. the pairs of the owners it scored then (an owner with a task in the last
``owner_slots`` slots, :class:`model.config.RankingConfig`), and it publishes forecasts for those owners only. This
benchmark replays both on the test period of a checkpoint's training split (the last ``test_fraction`` of the slots,
as ``trustbeam train`` held out), beside the running mean and the channel rule:

* ``bm``: the model's T_beh as it is (``--recalibration off``);
* ``bm_online``: the shift refitted on every test edge (the evaluation's replay);
* ``bm_job``: the shift refitted only on the edges whose owner the job had scored the slot before, what
  ``trustbeam run`` and ``trustbeam score`` publish (:func:`model.recalibration.replayed_shifts` with ``fitted``);

each scored on every test edge and on the edges the job publishes a forecast for (``published``): RMSE, MAE and
ECE of the published T_beh (the mean forecast; the evaluation's MAE reads the median readout instead).

Run: ``python -m bench.recalibration_bench --events out/btc/events.parquet --checkpoint out/btc-ckpt``.
"""

from __future__ import annotations

import argparse

import numpy as np
import pyarrow.parquet as pq

from bench.report import emit
from model.baselines import RULES, predict_edges
from model.checkpoint import load
from model.config import RankingConfig
from model.evaluate import CALIBRATION_BINS
from model.history import History
from model.metrics import expected_calibration_error, mae, rmse
from model.recalibration import RecalibrationConfig, replayed_shifts
from model.targets import targets
from model.train import TrainConfig, predict, time_split


def scored_owners(history: History, slots: list[int], owner_slots: int) -> np.ndarray:
    """(P,) for every edge of the target slots (:func:`model.targets.targets` order): whether its owner had a task in
    one of the ``owner_slots`` slots before the edge's, i.e. whether the job published a forecast for it."""
    out = []
    for t in slots:
        graph = history.graphs[t]
        recent = [history.graphs[s].src for s in range(max(t - owner_slots, 0), t) if history.graphs[s] is not None]
        out.append(np.isin(graph.src, np.concatenate(recent)) if recent else np.zeros(len(graph.src), bool))
    return np.concatenate(out) if out else np.zeros(0, bool)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", required=True, help="the log's events.parquet (import-log output)")
    parser.add_argument("--checkpoint", required=True, help="a checkpoint trained on that file (trustbeam train)")
    parser.add_argument("--owner-slots", type=int, default=RankingConfig().owner_slots)
    parser.add_argument("--test-fraction", type=float, default=None,
                        help="the held-out share of the slots (default: the checkpoint's training split)")
    parser.add_argument("--guard", type=float, default=RecalibrationConfig().guard,
                        help="standard errors a mean residual must clear (the job's --recalibration_guard)")
    args = parser.parse_args()
    model, index, manifest = load(args.checkpoint)
    config = model.config
    history = History.from_events(pq.read_table(args.events), config.clock, config.weights, index=index)
    fraction = args.test_fraction if args.test_fraction is not None else \
        manifest.get("metadata", {}).get("train", {}).get("test_fraction", TrainConfig().test_fraction)
    train_slots, test_slots = time_split(history, fraction)
    batch = targets(history, test_slots)
    edge_slot = batch.query.end + 1
    bm, observed = predict(model, history, test_slots)
    published = scored_owners(history, test_slots, args.owner_slots)
    recalibration = RecalibrationConfig(guard=args.guard)
    forecasts = {name: predict_edges(RULES[name](history, train_slots), history, test_slots)
                 for name in ("mean", "channel_beta")}
    forecasts["bm"] = bm
    for name, fitted in (("bm_online", None), ("bm_job", published)):
        shift = replayed_shifts(bm, observed, batch.tasks, edge_slot, recalibration, fitted)
        forecasts[name] = np.clip(bm + shift, 0.0, 1.0)
    rows = []
    for name, forecast in forecasts.items():
        row = {"method": name}
        for edges, mask in (("all", np.ones(len(bm), bool)), ("published", published)):
            f, y = forecast[mask], observed[mask]
            row.update({f"rmse_{edges}": round(rmse(f, y), 4), f"mae_{edges}": round(mae(f, y), 4),
                        f"ece_{edges}": round(expected_calibration_error(f, y, CALIBRATION_BINS), 4)})
        rows.append(row)
    emit("recalibration_bench", rows, {"events": args.events, "checkpoint": args.checkpoint,
                                       "model_version": manifest["model_version"],
                                       "train_slots": len(train_slots), "test_slots": len(test_slots),
                                       "test_fraction": fraction, "test_edges": len(bm),
                                       "published_edges": int(published.sum()),
                                       "owner_slots": args.owner_slots, "guard": args.guard})


if __name__ == "__main__":
    main()
