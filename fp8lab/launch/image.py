"""The SageMaker job's training image and the Transformer Engine (TE) it carries.

The launcher runs the AWS Deep Learning Container (DLC) for PyTorch training,
``pytorch-training:<JobSpec.framework_version>-gpu-<py_version>`` (default 2.9, py312), resolved by
the SDK's own table (``requests.training_image``). Which TE each image ships is read from that
image's Dockerfile in github.com/aws/deep-learning-containers: ``ARG TE_VERSION``, installed with
``pip install git+https://github.com/NVIDIA/TransformerEngine.git@release_v${TE_VERSION}``.

fp8lab needs TE >= 2.9 (``fp8lab.core.pins.MIN_TE``: ``te.autocast``). A job whose backend is ``te`` on
an image with an older TE, or one this table does not know, installs the pinned TE of
``fp8lab/constraints-gpu.txt`` from its requirements, as ``JobSpec(install_te=True)`` always does.
"""
from __future__ import annotations

from fp8lab.core.pins import MIN_TE, pins, requirement, te_supported

# framework_version -> (TE version in the image, where that is stated in aws/deep-learning-containers)
IMAGE_TE: dict[str, tuple[str, str]] = {
    "2.8": ("2.5", "pytorch/training/docker/2.8/py3/cu129/Dockerfile.gpu (ARG TE_VERSION=2.5)"),
    "2.9": ("2.8", "pytorch/training/docker/2.9/py3/cu130/Dockerfile.gpu (ARG TE_VERSION=2.8)"),
}

# framework_version -> the CUDA major its image is built on (the Dockerfile's folder above: cu129, cu130):
# the job installs the TE core built for it (setup.sh picks core_cu12 / core_cu13 the same way)
IMAGE_CUDA: dict[str, str] = {"2.8": "12", "2.9": "13"}

# The job's pip reads these while it installs the requirements: TE's PyTorch part is a source
# package that must build against the image's torch, so without build isolation (pip's inverted
# environment form of --no-build-isolation: PIP_NO_BUILD_ISOLATION=false), PyTorch only.
TE_BUILD_ENV = {"PIP_NO_BUILD_ISOLATION": "false", "NVTE_FRAMEWORK": "pytorch"}


def image_te(framework_version: str) -> str | None:
    """The TE version the PyTorch training image ships, or None where this table does not know it."""
    hit = IMAGE_TE.get(str(framework_version))
    return hit[0] if hit else None


def installs_te(spec) -> bool:
    """Whether the job installs the pinned TE: asked for (``install_te``), or its planned backend is ``te`` and
    the image's TE is older than fp8lab needs or unknown."""
    return bool(spec.install_te) or (spec.plan.backend == "te" and not te_supported(image_te(spec.framework_version)))


def te_release(install_te: bool, framework_version: str) -> str:
    """The Transformer Engine a job's TE backend runs on: the pinned one where the job installs it (asked for, or the
    image's is older than fp8lab needs or unknown), else the image's (the planned machine's ``te_release``)."""
    have = image_te(framework_version)
    return pins()["transformer-engine"] if install_te or not te_supported(have) else have


def te_in_job(spec) -> str:
    """One line for the plan: the image, its TE, and what the job does about it."""
    have = image_te(spec.framework_version)
    image = f"pytorch-training:{spec.framework_version}-gpu-{spec.py_version}"
    shipped = f"ships TE {have}" if have else "ships a TE this table does not know"
    if installs_te(spec):
        why = "asked (install_te=True)" if spec.install_te else f"fp8lab needs TE >= {'.'.join(map(str, MIN_TE))}"
        return f"{image} {shipped}; the job installs transformer-engine {pins()['transformer-engine']} ({why})"
    backend = spec.plan.backend
    return f"{image} {shipped}, which fp8lab supports" if backend == "te" else f"{image}; backend {backend}"


def job_requirements(install_te: bool, framework_version: str | None = None) -> list[str]:
    """The requirement lines TE adds to the job's requirements.txt (torch stays the image's): its PyTorch
    part and, where the image's CUDA is known (``IMAGE_CUDA``), the core built for that CUDA."""
    cuda = IMAGE_CUDA.get(str(framework_version)) if framework_version is not None else None
    return [requirement("transformer-engine", "pytorch" + (f",core_cu{cuda}" if cuda else ""))] if install_te else []
