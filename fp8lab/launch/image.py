"""The SageMaker job's training image and the Transformer Engine (TE) it carries.

Two families of AWS Deep Learning Containers (DLC) for PyTorch training, both in
github.com/aws/deep-learning-containers:

* ``pytorch-training:<version>-gpu-<py>`` (Ubuntu; 2.8, 2.9): the SageMaker SDK's ``image_uris`` table resolves
  them (``requests.training_image``). Their TE is the Dockerfile's ``ARG TE_VERSION``, older than fp8lab needs.
* ``pytorch:<version>-cu<cuda>-amzn2023-sagemaker`` (Amazon Linux 2023; 2.11 on): TE compiled in. The SDK's table
  (sagemaker-core 2.27) does not know them, so the job names the image by its URI: the DLC registry of the region
  (the SDK's own registry table, as for ``pytorch-training``), repository ``pytorch``, the tag below. Bundled
  versions: the repository's ``docs/pytorch/changelog`` (2.11-2.13) and ``docs/pytorch/index.md`` (2.14).

The default (:data:`DEFAULT_VERSION`) is the newest image whose torch fp8lab is tested with (at most
:data:`NEWEST_TESTED_TORCH`: the CPU tier's torch of ``requirements-cpu.lock``; the GPU stack pins 2.11) and whose
TE fp8lab supports (``fp8lab.core.pins.MIN_TE``): its TE is used as it is, so a ``te`` job builds nothing.
``JobSpec(image_uri=...)`` runs any other image; one this table does not know is assumed to lack a usable TE, and the
job installs the pinned TE of ``fp8lab/constraints-gpu.txt`` from its requirements (it compiles: the start-up
estimate adds :data:`TE_BUILD_S`), as ``JobSpec(install_te=True)`` always does.
"""
from __future__ import annotations

from dataclasses import dataclass

from fp8lab.core.pins import MIN_TE, pins, requirement, te_supported
from fp8lab.plan.flops_estimate import TE_BUILD_S  # the start-up a TE build adds (an assumption, declared there)

DLC = "github.com/aws/deep-learning-containers"


@dataclass(frozen=True)
class Image:
    """One PyTorch training image: where it is, the torch, TE and CUDA it ships, and where that is stated."""

    repository: str  # ECR repository of the DLC registry
    tag: str | None  # None: the SDK's image_uris table resolves it (pytorch-training)
    torch: str
    te: str | None
    cuda: str  # the CUDA major: the TE core a job that installs TE gets (core_cu12 / core_cu13)
    source: str

    @property
    def name(self) -> str:
        return f"{self.repository}:{self.tag}" if self.tag else self.repository


_CHANGELOG = f"{DLC} docs/pytorch/changelog/index.md"
# framework_version -> the image
IMAGES: dict[str, Image] = {
    "2.8": Image("pytorch-training", None, "2.8.0", "2.5", "12",
                 f"{DLC} pytorch/training/docker/2.8/py3/cu129/Dockerfile.gpu (ARG TE_VERSION=2.5)"),
    "2.9": Image("pytorch-training", None, "2.9.0", "2.8", "13",
                 f"{DLC} pytorch/training/docker/2.9/py3/cu130/Dockerfile.gpu (ARG TE_VERSION=2.8)"),
    "2.11": Image("pytorch", "2.11-cu130-amzn2023-sagemaker", "2.11.0", "2.12.0", "13",
                  f"{_CHANGELOG} (PyTorch 2.11, 2026-04-30: Transformer Engine 2.12.0)"),
    "2.12": Image("pytorch", "2.12-cu130-amzn2023-sagemaker", "2.12.1", "2.12.0", "13",
                  f"{_CHANGELOG} (PyTorch 2.12, 2026-07-02: Transformer Engine 2.12.0)"),
    "2.13": Image("pytorch", "2.13-cu133-amzn2023-sagemaker", "2.13.0", "2.17.0", "13",
                  f"{_CHANGELOG} (PyTorch 2.13, 2026-07-20: Transformer Engine 2.17.0)"),
    "2.14": Image("pytorch", "2.14-cu133-amzn2023-sagemaker", "2.14.0", "2.18.0", "13",
                  f"{DLC} docs/pytorch/index.md (PyTorch 2.14.0, Transformer Engine 2.18.0)"),
}

# The newest torch fp8lab's tests run on (requirements-cpu.lock's cpu-torch; tests/unit/test_launch_image.py checks
# they agree): a newer image's torch is untested here, so it is no default (image_uri= or framework_version= run it).
NEWEST_TESTED_TORCH = (2, 13)

# The job's pip reads these while it installs the requirements: TE's PyTorch part is a source
# package that must build against the image's torch, so without build isolation (pip's inverted
# environment form of --no-build-isolation: PIP_NO_BUILD_ISOLATION=false), PyTorch only.
TE_BUILD_ENV = {"PIP_NO_BUILD_ISOLATION": "false", "NVTE_FRAMEWORK": "pytorch"}


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(".")[:2])


def default_version() -> str:
    """The newest image whose torch is at most :data:`NEWEST_TESTED_TORCH` and whose TE fp8lab supports."""
    fits = [v for v, im in IMAGES.items() if _version(im.torch) <= NEWEST_TESTED_TORCH and te_supported(im.te)]
    return max(fits, key=_version)


DEFAULT_VERSION = default_version()


def image_of(framework_version: str, image_uri: str | None = None) -> Image | None:
    """The table's image of a job: by ``image_uri`` where given (matched by repository and tag; None where the table
    does not know it), else by ``framework_version``."""
    if image_uri:
        tail = image_uri.rsplit("/", 1)[-1]
        return next((im for im in IMAGES.values() if im.tag and tail == im.name), None)
    return IMAGES.get(str(framework_version))


def image_te(framework_version: str, image_uri: str | None = None) -> str | None:
    """The TE version the job's image ships, or None where this table does not know the image."""
    im = image_of(framework_version, image_uri)
    return im.te if im else None


def installs_te(spec) -> bool:
    """Whether the job installs the pinned TE: asked for (``install_te``), or its planned backend is ``te`` and
    the image's TE is older than fp8lab needs or unknown."""
    return bool(spec.install_te) or (
        spec.plan.backend == "te" and not te_supported(image_te(spec.framework_version, spec.image_uri)))


def image_label(spec) -> str:
    """The job's image as the plan names it: the table's repository:tag, or the URI given."""
    if spec.image_uri:
        return spec.image_uri
    im = IMAGES[spec.framework_version]
    return im.name if im.tag else f"{im.repository}:{spec.framework_version}-gpu-{spec.py_version}"


def te_release(install_te: bool, framework_version: str) -> str:
    """The Transformer Engine a job's TE backend runs on: the pinned one where the job installs it (asked for, or the
    image's is older than fp8lab needs or unknown), else the image's (the planned machine's ``te_release``)."""
    have = image_te(framework_version)
    return pins()["transformer-engine"] if install_te or not te_supported(have) else have


def te_in_job(spec) -> str:
    """One line for the plan: the image, its TE, and what the job does about it."""
    have = image_te(spec.framework_version, spec.image_uri)
    image = image_label(spec)
    shipped = f"ships TE {have}" if have else "ships a TE this table does not know"
    if installs_te(spec):
        why = "asked (install_te=True)" if spec.install_te else f"fp8lab needs TE >= {'.'.join(map(str, MIN_TE))}"
        return (f"{image} {shipped}; the job installs transformer-engine {pins()['transformer-engine']} ({why}; "
                f"compiling it adds {TE_BUILD_S // 60} min to the start-up estimate, assumed)")
    backend = spec.plan.backend
    if backend != "te":
        return f"{image}; backend {backend}"
    default = " (the default: the newest image of a torch fp8lab is tested with)" if (
        not spec.image_uri and spec.framework_version == DEFAULT_VERSION) else ""
    return f"{image} {shipped}, which fp8lab supports: no TE build in the job{default}"


def job_requirements(install_te: bool, framework_version: str | None = None, image_uri: str | None = None) -> list[str]:
    """The requirement lines TE adds to the job's requirements.txt (torch stays the image's): its PyTorch
    part and, where the image's CUDA is known (:data:`IMAGES`), the core built for that CUDA."""
    im = image_of(framework_version, image_uri) if framework_version is not None or image_uri else None
    cuda = im.cuda if im else None
    return [requirement("transformer-engine", "pytorch" + (f",core_cu{cuda}" if cuda else ""))] if install_te else []
