#!/usr/bin/env bash
# Create .venv and install fp8lab with everything the notebooks and tests need: one command for a
# CPU machine and an NVIDIA GPU machine. Idempotent: a run that finds the venv as the last complete
# set-up left it (its stamp: the digests of the pin files and fp8lab's version) says so and stops in
# seconds; `rm .venv/.fp8lab-setup` forces a full run.
#
#  - no NVIDIA GPU: the CPU build of torch first (never a multi-GB CUDA build), then fp8lab, both with
#    requirements-cpu.lock as pip constraints (every package pinned: pip never backtracks; regenerate it
#    with scripts/lock.sh); ends with `pip check`.
#  - NVIDIA GPU: the tested torch + Transformer Engine (TE) + torchao of fp8lab/constraints-gpu.txt
#    (the one place the GPU stack is pinned). TE's PyTorch part compiles here (several minutes),
#    with CUDA's compiler and headers from pip's NVIDIA packages when the machine has no toolkit.
#    A GPU below compute capability 8.9 has no FP8 tensor cores: TE is not installed and set-up
#    says that FP8 runs there only emulated. Ends with `fp8lab env --check`: TE imports, FP8 available.
#  - both: registers the Jupyter kernel `fp8lab` for this venv (JupyterLab, SageMaker Studio).
#
# Environment (all optional):
#   PYTHON             interpreter the venv is made from (python3)
#   FP8LAB_VENV        the venv (.venv)
#   FP8LAB_TORCH_SPEC  the torch to install instead of the CPU build / the pinned one (CPU: resolved
#                      without the lock, whose pins are for its own torch)
#   FP8LAB_EXTRAS      fp8lab's pip extras (default: requirements.txt + dev,aws,notebooks,tensorboard,mlflow)
#   FP8LAB_WHEELS      offline: a folder of wheels; every pip call uses --no-index --find-links it
#   FP8LAB_TE_KIT      a prebuilt TE kit (its install_te.sh and payload/; default .gpu/te-h200 where
#                      present), used where it fits this machine (README of the kit)
#   FP8LAB_CPU=1       the CPU branch even where an NVIDIA GPU is present
#   FP8LAB_CPU_TRITON=1  CPU: also triton (~640 MB, off the venv's path) for the test whose Triton interpreter runs
#                      fp8lab's loss kernel on the CPU (.ci/run sets it; elsewhere that test skips, saying why)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${FP8LAB_VENV:-.venv}
PINS=fp8lab/constraints-gpu.txt
LOCK=requirements-cpu.lock
KIT=${FP8LAB_TE_KIT:-.gpu/te-h200}
LOG_DIR=${TMPDIR:-/tmp}
pin() { sed -n "s/^$1==\([^ #]*\).*/\1/p" "$PINS"; }
lock_field() { sed -n "s/^# $1: //p" "$LOCK"; }  # the lock's header: cpu-torch, python
say() { echo "[setup] $*"; }
# pip's notes about this machine's local package mirrors are noise; errors still show (and the
# import check below fails the set-up if anything is missing)
quiet() { grep -v "^WARNING: Location" || true; }
INDEX=()
if [ -n "${FP8LAB_WHEELS:-}" ]; then INDEX=(--no-index --find-links "$FP8LAB_WHEELS"); fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
PIPV=("$VENV/bin/python" -m pip --disable-pip-version-check)  # long steps: pip's own lines show progress
# (the CPU branch's installs add --no-compile: byte-compiling every module of ~250 packages takes minutes
# on 2 cores; Python compiles what is imported, once, on first import)
EXTRAS_ARGS=(-r requirements.txt -e ".[dev,aws,notebooks,tensorboard,mlflow]")
if [ -n "${FP8LAB_EXTRAS+set}" ]; then EXTRAS_ARGS=(-e ".${FP8LAB_EXTRAS:+[$FP8LAB_EXTRAS]}"); fi

# The log's last line, printable ASCII only (pip's progress bars are not); pip's long silent phase, the
# unpacking of every collected package, by its count
step_status() {
  local last n
  last=$(tail -c 2000 "$1" | tr '\r' '\n' | LC_ALL=C tr -cd '\11\12\40-\176' | grep -v '^\s*$\| eta ' | tail -1 || true)
  if grep -q '^Installing collected packages:' "$1" && ! grep -q '^Successfully installed' "$1"; then
    n=$(sed -n 's/^Installing collected packages: //p' "$1" | tr ',' '\n' | grep -c . || true)
    echo "unpacking $n packages into the venv (pip says nothing until all are in)"
  else
    echo "${last:0:120}"
  fi
}

# A long step: its output goes to a log, a line every 20 s says it is still going (elapsed time
# and the log's last line); on failure the log's tail is shown.
long_step() {
  local label=$1; shift
  local log; log=$(mktemp "$LOG_DIR/fp8lab-setup.XXXXXX")
  say "$label (log: $log)"
  "$@" >"$log" 2>&1 &
  local pid=$! t0=$SECONDS
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    if (( (SECONDS - t0) % 20 == 0 && SECONDS - t0 >= 20 )); then
      say "  ... $((SECONDS - t0)) s: $(step_status "$log")"
    fi
  done
  if ! wait "$pid"; then tail -40 "$log" >&2; say "FAILED: $label" >&2; exit 1; fi
  say "  done in $((SECONDS - t0)) s"
}

# "<python major.minor> <torch version or -> <torch CUDA version or ->" of an interpreter
probe() {
  "$1" -c 'import sys, importlib.util as u  # fp8lab-probe
v = c = "-"
if u.find_spec("torch"):
    import torch
    v, c = torch.__version__, torch.version.cuda or "-"
print(f"{sys.version_info[0]}.{sys.version_info[1]} {v} {c}")'
}
# $1 torch version, $2 its CUDA version: a CUDA build of the pinned torch release (major.minor)
torch_fits() { [ "$2" != "-" ] && [ "$(echo "${1%%+*}" | cut -d. -f1-2)" = "$(pin torch | cut -d. -f1-2)" ]; }

# The stamp of a complete set-up: what it installed from (the pin files' digests, fp8lab's version, the
# options, this checkout) and, last, what it reported. A run that computes the same key has nothing to do.
STAMP="$VENV/.fp8lab-setup"
stamp_key() {
  local version; version=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' fp8lab/__init__.py)
  echo "fp8lab $version; $(cat "$LOCK" "$PINS" pyproject.toml requirements.txt | sha256sum | cut -c1-16);" \
       "gpu ${GPU:-none}; torch ${FP8LAB_TORCH_SPEC:-default}; extras ${FP8LAB_EXTRAS-default}; wheels ${FP8LAB_WHEELS:-index};" \
       "cpu-triton ${FP8LAB_CPU_TRITON:-0};" \
       "python $("$VENV/bin/python" -c 'import sys; print(sys.version.split()[0])' 2>/dev/null || echo none); $(pwd -P)"
}
kernel_registered() {  # the kernel in the venv and in the user's Jupyter folder (Linux or macOS)
  [ -f "$VENV/share/jupyter/kernels/fp8lab/kernel.json" ] && \
  { [ -f "${JUPYTER_DATA_DIR:-$HOME/.local/share/jupyter}/kernels/fp8lab/kernel.json" ] || \
    [ -f "$HOME/Library/Jupyter/kernels/fp8lab/kernel.json" ]; }
}

GPU=""
if [ "${FP8LAB_CPU:-0}" != 1 ] && command -v nvidia-smi >/dev/null 2>&1; then
  GPU=$(nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader 2>/dev/null | head -1 || true)
  # drivers older than 510 do not know compute_cap: the GPU by name, its capability left to the check
  if [ -z "$GPU" ] && nvidia-smi -L >/dev/null 2>&1; then
    GPU="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || echo 'NVIDIA GPU'), unknown"
  fi
fi

if [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ] && [ "$(head -1 "$STAMP")" = "$(stamp_key)" ] && kernel_registered; then
  say "$VENV is up to date: set up from these pin files, fp8lab version and options ($STAMP; remove it to redo)"
  say "ready: $(sed -n 2p "$STAMP")"
  exit 0
fi
rm -f "$STAMP"

if [ -z "$GPU" ]; then  # ---------------------------------------------------------------- CPU
  if [ ! -x "$VENV/bin/python" ]; then
    say "creating $VENV with $($PY --version)"
    "$PY" -m venv "$VENV"
  fi
  # the lock pins every package but torch, for Python >= its floor and its own CPU torch
  CONSTRAIN=(-c "$LOCK")
  PYV=$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  FLOOR=$(lock_field python); FLOOR=${FLOOR#>=}
  if [ -n "${FP8LAB_TORCH_SPEC:-}" ]; then
    CONSTRAIN=(); say "FP8LAB_TORCH_SPEC=$FP8LAB_TORCH_SPEC: resolving fp8lab's requirements for it, without $LOCK (slower)"
  elif [ "$(printf '%s\n' "$FLOOR" "$PYV" | sort -V | head -1)" != "$FLOOR" ]; then
    CONSTRAIN=(); say "Python $PYV is older than $LOCK's $FLOOR: resolving fp8lab's requirements without it (slower)"
  fi
  if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    TORCH_SPEC=${FP8LAB_TORCH_SPEC:-$(lock_field cpu-torch)}
    long_step "no GPU: installing the CPU build of torch ($TORCH_SPEC)" \
      "${PIPV[@]}" install --no-compile "${INDEX[@]}" "${CONSTRAIN[@]}" "$TORCH_SPEC"
    # never let the requirements below pull a multi-GB CUDA torch because this step failed
    "$VENV/bin/python" -W ignore -c "import torch" || { echo "[setup] torch did not install" >&2; exit 1; }
  fi
  # torchao for one CPU test only: its float8 FSDP2 all-gather on two gloo ranks (through torch's CPU _scaled_mm),
  # as fp8lab wires it. Kept off the venv's path: on a CPU torchao's compiled kernels do not load (it says so on
  # import) and fp8lab's torchao backend needs a GPU to train anyway. Best effort: without it that test skips.
  TAO="$VENV/cpu-tests/torchao"
  if [ ! -d "$TAO/torchao" ]; then
    say "torchao $(pin torchao) for the CPU test of its FSDP2 float8 all-gather (in the venv's cpu-tests/, off its path)"
    "${PIP[@]}" install "${INDEX[@]}" --no-deps --target "$TAO" "torchao==$(pin torchao)" 2>&1 | quiet \
      || say "torchao could not be installed: the CPU test of its all-gather will skip"
  fi
  # triton for one CPU test only, where asked (FP8LAB_CPU_TRITON=1): its interpreter runs fp8lab.train.ce_kernel, the
  # Triton loss kernel, on the CPU. The triton of the GPU stack's torch (2.11: 3.6.0), with numpy 2.2 beside it (that
  # interpreter fails on numpy 2.4's scalars), off the venv's path. Best effort: without it that test skips.
  TRI="$VENV/cpu-tests/triton"
  if [ "${FP8LAB_CPU_TRITON:-0}" = 1 ] && [ ! -d "$TRI/triton" ]; then
    say "triton 3.6.0 for the CPU test of fp8lab's Triton loss kernel (in the venv's cpu-tests/, off its path)"
    "${PIP[@]}" install "${INDEX[@]}" --no-deps --no-compile --target "$TRI" triton==3.6.0 numpy==2.2.6 2>&1 | quiet \
      || say "triton could not be installed: the CPU test of the Triton loss kernel will skip"
  fi
  long_step "installing fp8lab and its requirements${CONSTRAIN:+ (pinned by $LOCK)}" \
    "${PIPV[@]}" install --no-compile "${INDEX[@]}" "${CONSTRAIN[@]}" "${EXTRAS_ARGS[@]}"
  "${PIPV[@]}" check | quiet || { echo "[setup] pip check: the venv's packages conflict (above)" >&2; exit 1; }
else  # ----------------------------------------------------------------------------------- GPU
  GPU_NAME=${GPU%,*}; CC=${GPU##*, }
  FP8=$(awk -v c="$CC" 'BEGIN { print (c == "unknown" || c + 0 >= 8.9) ? 1 : 0 }')
  say "NVIDIA GPU: $GPU_NAME, compute capability $CC; the GPU stack of $PINS"
  if [ ! -x "$VENV/bin/python" ]; then
    read -r _ sys_torch sys_cuda <<<"$(probe "$PY")"
    if torch_fits "$sys_torch" "$sys_cuda"; then
      say "creating $VENV with $($PY --version), reusing its torch $sys_torch (CUDA $sys_cuda)"
      reuse=$("$PY" -c 'import site; print("\n".join(site.getsitepackages()))')
      # without pip where this Python cannot seed one (no ensurepip): its own pip is reachable below
      "$PY" -m venv --system-site-packages "$VENV" || "$PY" -m venv --clear --system-site-packages --without-pip "$VENV"
      # $PY may itself be a venv, whose packages are not the "system" ones: its folders by a .pth
      printf '%s\n' "$reuse" >"$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/fp8lab-system-packages.pth"
    else
      say "creating $VENV with $($PY --version)"
      "$PY" -m venv "$VENV"
    fi
  fi
  read -r PYV TORCH CUDA <<<"$(probe "$VENV/bin/python")"
  # FP8LAB_TORCH_SPEC: that torch, and the pins without theirs; else the pinned one unless it is there
  CONSTRAINTS_FILE=$PINS
  if [ -n "${FP8LAB_TORCH_SPEC:-}" ]; then
    CONSTRAINTS_FILE=$(mktemp "$LOG_DIR/fp8lab-constraints.XXXXXX"); grep -v '^torch==' "$PINS" >"$CONSTRAINTS_FILE"
    [ "$TORCH" = "-" ] && NEED_TORCH=1 || NEED_TORCH=0
  else
    torch_fits "$TORCH" "$CUDA" && NEED_TORCH=0 || NEED_TORCH=1
  fi
  CONSTRAIN=(-c "$CONSTRAINTS_FILE")
  if [ "$NEED_TORCH" = 1 ]; then
    long_step "installing ${FP8LAB_TORCH_SPEC:-torch==$(pin torch)} (a CUDA build: a few GB)" \
      "${PIPV[@]}" install "${INDEX[@]}" "${CONSTRAIN[@]}" "${FP8LAB_TORCH_SPEC:-torch==$(pin torch)}"
    read -r PYV TORCH CUDA <<<"$(probe "$VENV/bin/python")"
  fi
  [ "$CUDA" != "-" ] || { echo "[setup] torch $TORCH in $VENV is not a CUDA build" >&2; exit 1; }
  say "torch $TORCH (CUDA $CUDA), Python $PYV"
  long_step "installing fp8lab and its requirements" \
    "${PIPV[@]}" install "${INDEX[@]}" "${CONSTRAIN[@]}" "${EXTRAS_ARGS[@]}"
  TE_PIN=$(pin transformer-engine)
  TE_HAVE=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("transformer_engine"))' 2>/dev/null || true)
  SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  KIT_WHEEL=$(ls "$KIT"/payload/transformer_engine_torch-"$TE_PIN"-cp"${PYV/./}"-*.whl 2>/dev/null | head -1 || true)
  if [ "$FP8" != 1 ]; then
    say "$GPU_NAME has compute capability $CC < 8.9: no FP8 tensor cores, so FP8 runs here only emulated" \
        "(--backend emulated, pure PyTorch, for learning; not for speed). Transformer Engine and torchao are not installed."
  elif [ "$TE_HAVE" = "$TE_PIN" ]; then
    say "Transformer Engine $TE_HAVE already installed"
  elif [ -n "$KIT_WHEEL" ] && [ "$CC" = "9.0" ] && [ "${TORCH%%+*}" = "$(pin torch)" ] && [ "${CUDA%%.*}" = 13 ]; then
    say "Transformer Engine $TE_PIN from the prebuilt kit $KIT (sm_90, torch $TORCH)"
    PYTHON="$VENV/bin/python" bash "$KIT/install_te.sh" "$SITE"
    "${PIP[@]}" install --no-index --no-deps "$KIT"/payload/torchao/torchao-"$(pin torchao)"-*.whl
  else
    CU=${CUDA%%.*}
    if ! command -v nvcc >/dev/null 2>&1 && [ ! -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ]; then
      nvcc_pkg=$([ "$CU" = 12 ] && echo "nvidia-cuda-nvcc-cu12" || echo "nvidia-cuda-nvcc")
      long_step "no CUDA toolkit here: CUDA's compiler from pip ($nvcc_pkg==$CUDA.*)" \
        "${PIPV[@]}" install "${INDEX[@]}" "$nvcc_pkg==$CUDA.*"
      NVCC=$(find "$SITE/nvidia" -path '*/bin/nvcc' -type f 2>/dev/null | head -1)
      [ -n "$NVCC" ] || { echo "[setup] nvcc not found after installing $nvcc_pkg" >&2; exit 1; }
      export CUDA_HOME=$(dirname "$(dirname "$NVCC")") PATH="$(dirname "$NVCC"):$PATH"
    fi
    # the CUDA and cuDNN headers of pip's NVIDIA packages (torch's dependencies)
    INC=$(ls -d "$SITE"/nvidia/*/include 2>/dev/null | tr '\n' ':' || true)
    long_step "installing TE's build tools" "${PIPV[@]}" install "${INDEX[@]}" setuptools wheel pybind11 ninja cmake
    long_step "building Transformer Engine $TE_PIN for PyTorch + torchao $(pin torchao) (compiles; several minutes)" \
      env NVTE_FRAMEWORK=pytorch MAX_JOBS="${MAX_JOBS:-$(nproc)}" CPLUS_INCLUDE_PATH="${INC}${CPLUS_INCLUDE_PATH:-}" \
      "${PIPV[@]}" install "${INDEX[@]}" "${CONSTRAIN[@]}" --no-build-isolation -v \
      "transformer_engine[pytorch,core_cu$CU]==$TE_PIN" "torchao==$(pin torchao)"
  fi
  if [ "$FP8" = 1 ]; then  # TE's debug API, which reads the FP8 health statistics (--fp8-stats-source auto: te-debug)
    "${PIP[@]}" install "${INDEX[@]}" --no-deps "nvdlfw-inspect==$(pin nvdlfw-inspect)" 2>&1 | quiet \
      || say "nvdlfw-inspect could not be installed: FP8 health statistics are read by fp8lab's hooks instead"
  fi
fi
"$VENV/bin/python" -c "import fp8lab, torch, transformers, papermill" \
  || { echo "[setup] install failed: fp8lab or a dependency does not import" >&2; exit 1; }
KERNEL_ENV=()
if [ -n "$GPU" ]; then
  # torch's pip cuDNN first on the library path, for TE too: else TE can bind an older system cuDNN
  # and torch's cuDNN calls fail ("cuDNN version incompatibility"). In the kernel and in activate.
  CUDNN=$("$VENV/bin/python" -c 'import nvidia.cudnn as m, os; print(os.path.join(list(m.__path__)[0], "lib"))' 2>/dev/null || true)
  if [ -n "$CUDNN" ] && [ -d "$CUDNN" ]; then
    export LD_LIBRARY_PATH="$CUDNN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    KERNEL_ENV=(--env LD_LIBRARY_PATH "$LD_LIBRARY_PATH")
    grep -q "fp8lab: cuDNN" "$VENV/bin/activate" || \
      echo "export LD_LIBRARY_PATH=\"$CUDNN\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}\"  # fp8lab: cuDNN of torch first" >>"$VENV/bin/activate"
  fi
fi
# The kernel `fp8lab` runs this venv's interpreter: in the venv (its own JupyterLab, papermill) and in
# the user's Jupyter folder, where SageMaker Studio's and any other JupyterLab find it.
for where in --sys-prefix --user; do
  "$VENV/bin/python" -m ipykernel install "$where" --name fp8lab --display-name "fp8lab (Python 3)" \
    "${KERNEL_ENV[@]}" >/dev/null
done
say "Jupyter kernel 'fp8lab' registered: in JupyterLab or SageMaker Studio pick 'fp8lab (Python 3)'"
if [ -n "$GPU" ]; then "$VENV/bin/python" -m fp8lab env --check; fi
READY=$("$VENV/bin/python" -c 'import torch, fp8lab; print("fp8lab", fp8lab.__version__, "torch", torch.__version__)')
printf '%s\n%s\n' "$(stamp_key)" "$READY" >"$STAMP"
say "ready: $READY"
