"""The trained model back as a Hugging Face model: ``save_pretrained`` in its original class, plus the tokenizer."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from fp8lab.data import tokens as fdata
from fp8lab.fp8.convert import hf_state_dict_from
from fp8lab.model import user as user_model
from fp8lab.model.models import MODEL_CONFIGS, build_model
from fp8lab.records import ownership


def _write_errors() -> tuple[type[BaseException], ...]:
    """What a failed write raises besides OSError: safetensors' own error (a full disk, a file-size limit)."""
    try:
        from safetensors import SafetensorError
    except ImportError:  # pragma: no cover - safetensors is a dependency of transformers
        return ()
    return (SafetensorError,)


WRITE_ERRORS = _write_errors()


def _export_hf_state_dict(model, inner, conversion, master=None) -> dict:
    """Full HF-named weights on rank 0 (every rank must call: FSDP2 gathers the shards).

    Under ``--param-dtype bf16`` the weights are fp32: the optimizer's fp32 masters (``master``, one
    process / DDP), or FSDP2's fp32 sharded parameters (it casts to bf16 only when gathering)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if master is not None and full:
        full = master.model_state_dict(full)  # (the bf16 copies go as the name is rebound: host memory, at 7B)
    if not full:  # a rank other than 0
        return full
    if conversion is None:  # plain HF model: each weight its own tensor, not a view of --memory offload's one buffer
        return {k: v.clone() if v.untyped_storage().nbytes() > v.nbytes else v for k, v in full.items()}
    return hf_state_dict_from(inner, full)  # (copies every tensor)


def save_hf_model(model, inner, conversion, plan, model_dir: Path, data_dir: Path, env, master=None,
                  run: str | None = None, write: Callable[[Path], None] | None = None) -> None:
    """``save_pretrained`` of the trained weights in the original HF class, plus the tokenizer.

    ``plan``: the run's (fp8lab.plan.runplan.RunPlan: its model and ModelConfig). ``model`` is what trained (maybe
    DDP/FSDP-wrapped), ``inner`` the module inside it, ``master`` the fp32 master weights of ``--param-dtype bf16``
    (written instead of the bf16 parameters). ``write``: writes the folder's weights into the folder it is given
    instead (rank 0 only; LoRA's adapter folder or merged model, fp8lab.train.lora), beside the same tokenizer."""
    sd = _export_hf_state_dict(model, inner, conversion, master) if write is None else None
    if not env.is_main:
        return
    from transformers import PreTrainedTokenizerFast
    from transformers.utils import logging as hf_logging

    name = plan.config.model
    if write is None:  # a named shape: the plan's ModelConfig; a user's folder: its own config
        hf = build_model(name, device="meta", config=plan.model_config if name in MODEL_CONFIGS else None)
        write = lambda folder: hf.save_pretrained(str(folder), state_dict=sd)  # noqa: E731
    ownership.refuse_foreign("--model-dir", model_dir, "model")  # as at the start: nothing of the user's is replaced
    # written whole into a fresh folder fp8lab creates, then moved in file by file
    # the model folder notes the run it holds (``run``: its id), so another run is refused it at its start
    stage = Path(tempfile.mkdtemp(dir=ownership.claim(model_dir, "model", run=run), prefix=ownership.TMP_PREFIX))
    bar_was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # one-shard "Writing model shards" bars only clutter the log
    try:
        write(stage)
        # the user's folder had a tokenizer that maps tokens as the data's does: it goes back along; one that maps them
        # otherwise would decode the trained ids wrongly, so the data's goes instead (said at the start: the trainer)
        data_tokenizer = data_dir / "tokenizer.json"
        if user_model.tokenizer_differs(name, data_tokenizer) or not user_model.copy_tokenizer(name, stage):
            tok = PreTrainedTokenizerFast(tokenizer_file=str(data_tokenizer), eos_token=fdata.EOS_TOKEN)
            tok.save_pretrained(str(stage))
        names = sorted(f.name for f in stage.iterdir())
        for f in stage.iterdir():  # as open() makes files (safetensors writes its own private): one mode for all
            os.chmod(f, 0o666 & ~ownership.UMASK)
        ownership.refuse_foreign("--model-dir", model_dir, "model")
        for name in names:
            os.replace(stage / name, model_dir / name)
        ownership.record(model_dir, *names)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        if bar_was_on:
            hf_logging.enable_progress_bar()
