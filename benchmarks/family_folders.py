"""Model folders as a user brings them: a published config.json (``data/reference/configs``) with
random weights, written by ``save_pretrained`` (bf16 safetensors, seeded), for the families study.

    python benchmarks/family_folders.py --out /tmp/families llama-3.2-1b qwen2.5-1.5b mistral-7b-v0.3:16

``NAME:N`` keeps the first N decoder layers only (``num_hidden_layers: N`` in the folder's config,
for shapes that do not fit one GPU); the folder is then called ``NAME-Nl`` and its config hash differs
from the published one, as it should. Prints each folder with the SHA-256 of its config.json.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "data" / "reference" / "configs"


def make_folder(spec: str, out: Path, device: str) -> Path:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    name, _, layers = spec.partition(":")
    d = json.loads((CONFIGS / name / "config.json").read_text())
    if layers:
        d["num_hidden_layers"] = int(layers)
    folder = out / (f"{name}-{layers}l" if layers else name)
    cfg = AutoConfig.for_model(d.pop("model_type"), **d)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(str(folder))
    del model
    return folder


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="+", help=f"NAME or NAME:LAYERS; names: {', '.join(sorted(x.name for x in CONFIGS.iterdir() if x.is_dir()))}")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--device", default="cuda")
    args = p.parse_args(argv)
    for spec in args.models:
        folder = make_folder(spec, args.out, args.device)
        sha = hashlib.sha256((folder / "config.json").read_bytes()).hexdigest()
        print(f"{folder} config.json sha256 {sha}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
