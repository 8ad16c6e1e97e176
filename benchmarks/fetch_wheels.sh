#!/usr/bin/env bash
# Download, on a machine that reaches PyPI, the wheels fp8lab's set-up needs on the H200 test machine
# that its image lacks: CPython 3.12, manylinux x86_64; the packages the image already has are left
# out (the list below: /work/.library/device/KINDS.md, "Python packages already there", 2026-11-17).
# Into .whl/ (ignored by git), about 15 MB, for benchmarks/gpu_setup_check.sh:
#
#   bash benchmarks/fetch_wheels.sh [DIR=.whl]
#
# What is fetched: fp8lab's own dependencies without extras (papermill, nbformat, ipykernel,
# ipywidgets and theirs) and setuptools + wheel (pip builds the editable fp8lab offline). torch,
# transformers, numpy, pandas, matplotlib and tqdm come with the image; Transformer Engine and
# torchao come from the TE kit (.gpu/te-h200).
set -euo pipefail
cd "$(dirname "$0")/.."
D=${1:-.whl}
PY=${PYTHON:-python3}
IMAGE_HAS="absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-
pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx
huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-
cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-
operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py
mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda
numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-
cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-
nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-
headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft
pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout
pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-
core scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham
simplejson six sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore
threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric
torchmetrics torchvision tqdm transformers treescope triton typer typing-extensions typing-inspect urllib3
uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp"
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
"$PY" -m pip download -q --disable-pip-version-check -d "$TMP" --only-binary=:all: --python-version 3.12 \
  --implementation cp --abi cp312 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 "papermill>=2.6" nbformat ipykernel ipywidgets "setuptools>=68" wheel \
  2>&1 | grep -v "^WARNING: Location" || true
# TE's debug API (--fp8-stats-source te-debug): pure Python; its torch and pyyaml come with the image
"$PY" -m pip download -q --disable-pip-version-check -d "$TMP" --no-deps "nvdlfw-inspect==$(sed -n 's/^nvdlfw-inspect==//p' fp8lab/constraints-gpu.txt)" \
  2>&1 | grep -v "^WARNING: Location" || true
mkdir -p "$D"
for whl in "$TMP"/*.whl; do
  name=$(basename "$whl" | cut -d- -f1 | tr '[:upper:]_.' '[:lower:]--')
  # setuptools, wheel (and its packaging) stay: pip builds the editable fp8lab in an isolated environment from here
  if [[ ! " setuptools wheel packaging " == *" $name "* ]] && tr ' \n' '\n\n' <<<"$IMAGE_HAS" | grep -qx -- "$name"; then
    continue
  fi
  cp "$whl" "$D/"
done
echo "$(ls "$D"/*.whl | wc -l) wheels, $(du -sh "$D" | cut -f1) in $D"
