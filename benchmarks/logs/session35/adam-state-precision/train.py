import sys, json, math, time, argparse
import numpy as np, torch
from fp8lab.model.models import build_model

p = argparse.ArgumentParser()
p.add_argument("--m", default="fp32"); p.add_argument("--v", default="fp32")
p.add_argument("--seed", type=int, default=0); p.add_argument("--steps", type=int, default=400)
p.add_argument("--hidden", type=int, default=256); p.add_argument("--layers", type=int, default=4)
p.add_argument("--inter", type=int, default=688)
p.add_argument("--bs", type=int, default=8); p.add_argument("--seq", type=int, default=128)
p.add_argument("--lr", type=float, default=1e-3); p.add_argument("--threads", type=int, default=1)
p.add_argument("--out", default=None)
a = p.parse_args()
torch.set_num_threads(a.threads)

def fp16s(x):
    s = x.abs().max() / (65504 / 2)
    if s == 0: return torch.zeros_like(x)
    return (x / s).half().float() * s
def fp8s(x):
    s = x.abs().max() / 448
    if s == 0: return torch.zeros_like(x)
    return (x / s).to(torch.float8_e4m3fn).float() * s
FMT = {"fp32": lambda x: x, "bf16": lambda x: x.bfloat16().float(), "fp16s": fp16s, "fp8s": fp8s}

class AdamW:
    def __init__(self, groups, lr, betas=(0.9, 0.95), eps=1e-8, mfmt="fp32", vfmt="fp32"):
        self.groups = groups; self.lr = lr; self.b1, self.b2 = betas; self.eps = eps
        self.mf, self.vf = FMT[mfmt], FMT[vfmt]; self.t = 0
        self.state = {id(p): (torch.zeros_like(p), torch.zeros_like(p)) for g in groups for p in g["params"]}
        self.last_v_raw = {}
    @torch.no_grad()
    def step(self, lr, keep_raw=False):
        self.t += 1; t = self.t
        bc1 = 1 - self.b1 ** t; bc2 = 1 - self.b2 ** t
        for g in self.groups:
            wd = g["weight_decay"]
            for p in g["params"]:
                if p.grad is None: continue
                m, v = self.state[id(p)]; gr = p.grad
                m_new = self.b1 * m + (1 - self.b1) * gr          # fp32 math on read-back state
                v_new = self.b2 * v + (1 - self.b2) * gr * gr
                p.mul_(1 - lr * wd)
                p.add_(-(lr) * (m_new / bc1) / ((v_new / bc2).sqrt() + self.eps))
                if keep_raw: self.last_v_raw[id(p)] = (v_new.clone(), m_new.clone())
                m.copy_(self.mf(m_new)); v.copy_(self.vf(v_new))   # storage round trip after the step

model = build_model("llama-tiny", seed=a.seed, hidden_size=a.hidden, num_layers=a.layers,
                    intermediate_size=a.inter, num_heads=a.hidden // 64, num_kv_heads=max(1, a.hidden // 128))
model.train()
nparam = sum(p.numel() for p in model.parameters())
params = [p for p in model.parameters() if p.requires_grad]
groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": 0.1},
          {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
opt = AdamW(groups, a.lr, mfmt=a.m, vfmt=a.v)
tr = np.memmap("<data>/train_00000.bin", dtype=np.uint16, mode="r")
va = np.memmap("<data>/val_00000.bin", dtype=np.uint16, mode="r")
rng = np.random.default_rng(1000 + a.seed)
L = a.seq + 1
starts = rng.integers(0, len(tr) - L, size=(a.steps, a.bs))
vstarts = np.linspace(0, len(va) - L - 1, 64).astype(int)
vx = torch.from_numpy(np.stack([va[s:s + L].astype(np.int64) for s in vstarts]))
warm = 20; minlr = a.lr / 10
def lr_at(i):
    if i < warm: return a.lr * (i + 1) / warm
    pr = (i - warm) / max(1, a.steps - warm)
    return minlr + (a.lr - minlr) * 0.5 * (1 + math.cos(math.pi * pr))
def val_loss():
    model.eval(); tot = 0.0
    with torch.no_grad():
        for j in range(0, len(vx), 16):
            b = vx[j:j + 16]; tot += model(input_ids=b[:, :-1], labels=b[:, 1:].contiguous()).loss.item() * len(b) if False else \
                torch.nn.functional.cross_entropy(model(input_ids=b[:, :-1]).logits.reshape(-1, model.config.vocab_size), b[:, 1:].reshape(-1)).item() * len(b)
    model.train(); return tot / len(vx)
losses = []; t0 = time.time(); nonfinite = False
for i in range(a.steps):
    x = torch.from_numpy(np.stack([tr[s:s + L].astype(np.int64) for s in starts[i]]))
    logits = model(input_ids=x[:, :-1]).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
    model.zero_grad(set_to_none=True); loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step(lr_at(i), keep_raw=(i == a.steps - 1))
    losses.append(loss.item())
    if not math.isfinite(losses[-1]): nonfinite = True; break
    if i % 50 == 0: print(i, round(losses[-1], 4), round(time.time() - t0, 1), flush=True)
res = {"m": a.m, "v": a.v, "seed": a.seed, "params": nparam, "steps": len(losses), "time": time.time() - t0,
       "train_last20": float(np.mean(losses[-20:])), "val": val_loss() if not nonfinite else float("nan")}
# storage diagnostics on the final pre-storage (fp32-computed) v and m
diag = {}
for fname in ("bf16", "fp16s", "fp8s"):
    for which in (0, 1):
        n = z = big = nz = 0
        for raw in opt.last_v_raw.values():
            x = raw[which]; y = FMT[fname](x); nzm = x != 0
            n += x.numel(); nz += int(nzm.sum())
            z += int(((y == 0) & nzm).sum())
            rel = ((y - x).abs() / x.abs().clamp_min(1e-45))[nzm]
            big += int((rel > 0.01).sum())
        diag[f"{'v' if which == 0 else 'm'}_{fname}"] = {"frac_zeroed": z / max(nz, 1), "frac_relerr>1%": big / max(nz, 1), "frac_true_zero": 1 - nz / n}
res["diag"] = diag
print(json.dumps(res))
if a.out: json.dump(res, open(a.out, "w"))
