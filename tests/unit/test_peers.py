"""The peers table: peer runs (benchmarks/peers.py) beside fp8lab's own runs of the same study, never in the headline."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fp8lab import analysis
from fp8lab.analysis.peers import lead_over_peers, peer_rows, peers_table


def _summary() -> pd.DataFrame:
    rows = [("fp8lab", "bf16", 78_000.0, np.nan), ("fp8lab", "fp8", 102_000.0, np.nan),
            ("peer", "bf16", 69_000.0, True), ("peer", "fp8", 79_000.0, True), ("peer", "fp8", 64_000.0, True)]
    return pd.DataFrame([{"study": "peers-x", "model": "llama-1b", "gpu_name": "NVIDIA H100 80GB HBM3",
                          "variant": f"{who}-{prec}-{i}", "precision": prec, "tokens_per_sec_per_gpu": tps,
                          "mfu": 0.5, "max_mem_gib": 40.0, "peer": peer, "run_id": f"r{i}"}
                         for i, (who, prec, tps, peer) in enumerate(rows)])


def test_the_peers_table_puts_each_peer_beside_fp8labs_fp8():
    s = _summary()
    assert peer_rows(s).tolist() == [False, False, True, True, True]
    t = peers_table(s, lambda r: "8x2048")
    assert t["who"].tolist() == ["fp8lab", "peer", "fp8lab", "peer", "peer"]  # fastest first
    assert t["relative_to_fp8lab_fp8"].iloc[0] == pytest.approx(1.0)
    lead = lead_over_peers(t).iloc[0]
    assert lead["fastest_peer_tps"] == 79_000.0 and lead["lead"] == pytest.approx(102_000 / 79_000)


def test_a_summary_without_peers_has_an_empty_table():
    s = _summary().drop(columns="peer")
    assert not peer_rows(s).any() and peers_table(s, lambda r: "-").empty
    assert lead_over_peers(peers_table(s, lambda r: "-")).empty


def test_the_committed_peers_study_leaves_the_headline_to_fp8lab():
    summary = analysis.summarize_runs(analysis.load_runs())
    best = analysis.best_runs(summary)
    peers = set(summary.loc[peer_rows(summary), "run_id"])
    assert peers and not peers & set(best["run_id"])  # no peer run is one of fp8lab's headline runs
    lead = lead_over_peers(peers_table(summary, analysis.layout_label))
    assert (lead["lead"] >= 1.25).all()  # fp8lab's FP8 against the fastest peer, on the same GPU (issue target)
