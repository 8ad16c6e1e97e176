"""fp8lab beside its peers: what a user would run instead (plain transformers + ``torch.compile``, in BF16 and with
torchao float8), measured on the same GPU in the same call as fp8lab's plain commands (``benchmarks/peers.py``,
``benchmarks/study_p5.sh``). Peer runs are not fp8lab's own: the headline leaves them out (:func:`is_peer`), and
:func:`peers_table` puts them beside fp8lab's plain BF16 and FP8 runs of the same study, model and GPU."""
from __future__ import annotations

import numpy as np
import pandas as pd

from fp8lab.analysis.labels import is_flag

PEER_VARIANT = "peer-"  # the run id's and record variant's mark of a peer run (benchmarks/peers.py writes both)
PEER_COLUMNS = ["study", "model", "gpu_name", "who", "variant", "precision", "layout", "tokens_per_sec_per_gpu", "mfu",
                "max_mem_gib",
                "relative_to_fp8lab_fp8"]


def is_peer(flag: object) -> bool:
    """Whether a run's ``peer`` column marks a peer's run, not fp8lab's (absent or NaN: fp8lab's own)."""
    return is_flag(flag)


def peer_rows(summary: pd.DataFrame) -> pd.Series:
    """Boolean mask of the peer runs of a runs or summary table."""
    if "peer" not in summary:
        return pd.Series(False, index=summary.index)
    return summary["peer"].map(is_peer).astype(bool)


def peers_table(summary: pd.DataFrame, layout_label) -> pd.DataFrame:
    """Per study, model and GPU that holds peer runs: each peer run and fp8lab's plain-command runs of the same
    study, fastest first, with tokens/s/GPU relative to fp8lab's fastest FP8 run there.
    ``layout_label``: how a run's layout is written (fp8lab.analysis.layout_label)."""
    if not len(summary):
        return pd.DataFrame(columns=PEER_COLUMNS)
    s = summary.assign(_peer=peer_rows(summary))
    rows = []
    for (study, model, gpu), g in s[s["study"].isin(s.loc[s["_peer"], "study"])].groupby(
            ["study", "model", "gpu_name"], sort=True):
        mine, theirs = g[~g["_peer"]], g[g["_peer"]]
        if not len(theirs):
            continue
        fp8 = mine[mine["precision"].astype(str).str.startswith("fp8")]["tokens_per_sec_per_gpu"]  # fp8lab's own
        ref = float(fp8.max()) if len(fp8) else np.nan
        for who, part in (("fp8lab", mine), ("peer", theirs)):
            for _, r in part.iterrows():
                rows.append({"study": study, "model": model, "gpu_name": gpu, "who": who, "variant": r["variant"],
                             "precision": r["precision"],
                             "layout": layout_label(r), "tokens_per_sec_per_gpu": r["tokens_per_sec_per_gpu"],
                             "mfu": r.get("mfu"), "max_mem_gib": r.get("max_mem_gib"),
                             "relative_to_fp8lab_fp8": r["tokens_per_sec_per_gpu"] / ref})
    out = pd.DataFrame(rows, columns=PEER_COLUMNS)
    return out.sort_values(["study", "model", "gpu_name", "tokens_per_sec_per_gpu"],
                           ascending=[True, True, True, False],
                           ignore_index=True)


def lead_over_peers(table: pd.DataFrame) -> pd.DataFrame:
    """Per study, model and GPU: fp8lab's fastest FP8 over the fastest peer run (any precision) and which peer that
    is."""
    rows = []
    for (study, model, gpu), g in table.groupby(["study", "model", "gpu_name"], sort=True):
        mine = g[(g["who"] == "fp8lab") & g["precision"].astype(str).str.startswith("fp8")]
        theirs = g[g["who"] == "peer"]
        if not len(mine) or not len(theirs):
            continue
        best = theirs.loc[theirs["tokens_per_sec_per_gpu"].idxmax()]
        rows.append({"study": study, "model": model, "gpu_name": gpu, "fastest_peer": best["variant"],
                     "fastest_peer_tps": best["tokens_per_sec_per_gpu"],
                     "fp8lab_fp8_tps": mine["tokens_per_sec_per_gpu"].max(),
                     "lead": mine["tokens_per_sec_per_gpu"].max() / best["tokens_per_sec_per_gpu"]})
    return pd.DataFrame(rows,
                        columns=["study", "model", "gpu_name", "fastest_peer", "fastest_peer_tps", "fp8lab_fp8_tps",
                                       "lead"])
