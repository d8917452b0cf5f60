"""MetaSchedule's XGBoost cost model, kept between tuning sessions as data, never as code.

TVM's ``XGBModel.save/load`` writes a tar of xgboost's model and a numpy object array that ``load`` reads with
``np.load(allow_pickle=True)``: loading another lab's file that way can run that lab's code, and in 0.27 loading
a model saved before any training raises. Here the same state is one ``.npz`` of plain arrays, read with
``allow_pickle=False``:

    booster          uint8   xgboost's own model (UBJSON, ``Booster.save_raw``); empty before any training
    group_hashes     str     one per workload group (MetaSchedule's structural hash of the task's module)
    candidate_group  int32   per measured candidate: its group
    candidate_rows   int32   per candidate: how many feature rows (one per buffer store) it has
    features         float32 every candidate's feature rows, concatenated
    costs            float32 per candidate: its mean measured time (1e10 for a failed one, as TVM stores them)
    last_train_size  int64   the sample count of the last training (TVM's adaptive retraining)

``farm.tune`` saves it with the store's records for the tuning key after every session and loads it before the
next one, so a session starts from everything the farm measured for that target, not from random predictions.
"""

from __future__ import annotations

import io
from collections import OrderedDict
from typing import Any

import numpy as np
from tvm.s_tir.meta_schedule.cost_model.xgb_model import FeatureGroup, XGBModel

from farm.errors import FarmError
from farm.tvm_private import XGBState, set_xgb_state, xgb_state

FORMAT = "farm-xgb-1"  # what the file holds; a pack's manifest names it


def new_cost_model(cores: int | None) -> XGBModel:
    """The cost model ``tune_tasks`` would make for ``cost_model="xgb"``, held by farm so it can be saved."""
    return XGBModel(num_tuning_cores=cores, tree_method="auto")


def samples_of(model: XGBModel) -> int:
    return xgb_state(model).data_size


def dump_cost_model(model: XGBModel) -> bytes:
    """The model's booster and training data as one ``.npz`` (bytes)."""
    state = xgb_state(model)
    groups = list(state.data.values())
    features = [f for g in groups for f in g.features]
    width = next((f.shape[1] for f in features if f.ndim == 2 and f.shape[0]), 0)
    raw = bytes(state.booster.save_raw(raw_format="ubj")) if state.booster is not None else b""
    arrays: dict[str, Any] = {
        "format": np.array(FORMAT),
        "booster": np.frombuffer(raw, dtype=np.uint8),
        "group_hashes": np.array([g.group_hash for g in groups], dtype=str),
        "candidate_group": np.array([i for i, g in enumerate(groups) for _ in g.features], dtype=np.int32),
        "candidate_rows": np.array([f.shape[0] for f in features], dtype=np.int32),
        "features": (np.concatenate([f.reshape(-1, width) for f in features]).astype(np.float32)
                     if features else np.zeros((0, width), dtype=np.float32)),
        "costs": (np.concatenate([np.asarray(g.costs, dtype=np.float32) for g in groups])
                  if groups else np.zeros(0, dtype=np.float32)),
        "last_train_size": np.array(state.last_train_size, dtype=np.int64),
    }
    out = io.BytesIO()
    np.savez_compressed(out, **arrays)
    return out.getvalue()


def load_cost_model(model: XGBModel, blob: bytes) -> int:
    """Fill ``model`` (fresh) from ``dump_cost_model``'s bytes; returns its sample count. Data only: no pickle."""
    import xgboost as xgb

    try:
        with np.load(io.BytesIO(blob), allow_pickle=False) as arrays:
            if str(arrays["format"]) != FORMAT:
                raise ValueError(f"format {arrays['format']} is not {FORMAT}")
            hashes = [str(h) for h in arrays["group_hashes"]]
            groups_of, rows_of = arrays["candidate_group"], arrays["candidate_rows"]
            features, costs = arrays["features"], arrays["costs"]
            raw, last_train = arrays["booster"].tobytes(), int(arrays["last_train_size"])
    except (OSError, KeyError, ValueError) as exc:
        raise FarmError(f"the saved cost model is not readable: {exc}",
                        "tune once without it (a fresh model trains from the session's measurements)") from exc
    per_group: dict[int, tuple[list[np.ndarray], list[float]]] = {}
    start = 0
    for group, rows, cost in zip(groups_of, rows_of, costs):
        feats, group_costs = per_group.setdefault(int(group), ([], []))
        feats.append(features[start:start + int(rows)])
        group_costs.append(float(cost))
        start += int(rows)
    data = OrderedDict()
    for index, (feats, group_costs) in sorted(per_group.items()):
        data[hashes[index]] = FeatureGroup(hashes[index], feats, np.array(group_costs, dtype=np.float32))
    booster = None
    if raw:
        booster = xgb.Booster()
        booster.load_model(bytearray(raw))
    set_xgb_state(model, XGBState(data, len(costs), last_train, booster))
    return len(costs)
