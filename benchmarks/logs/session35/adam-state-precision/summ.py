import json, glob
R = {f: json.load(open(f)) for f in sorted(glob.glob("<results>/r_*.json"))}
base = R.get("<results>/r_fp32_fp32_s0.json")
for f, r in R.items():
    g = lambda k: 100 * (r[k] / base[k] - 1)
    print(f"{r['m']:>5}/{r['v']:<5} s{r['seed']} train {r['train_last20']:.4f} ({g('train_last20'):+.2f}%) val {r['val']:.4f} ({g('val'):+.2f}%) t={r['time']:.0f}s")
    d = r["diag"]
    print("   v_bf16 zero %.2e >1%% %.2e | v_fp16s zero %.2e >1%% %.2e | m_fp8s zero %.3f >1%% %.3f | m_fp16s >1%% %.2e" % (
        d["v_bf16"]["frac_zeroed"], d["v_bf16"]["frac_relerr>1%"], d["v_fp16s"]["frac_zeroed"], d["v_fp16s"]["frac_relerr>1%"],
        d["m_fp8s"]["frac_zeroed"], d["m_fp8s"]["frac_relerr>1%"], d["m_fp16s"]["frac_relerr>1%"]))
