"""Which algorithm a convolution layer runs, decided once per plan from the layer's geometry.

An algorithm is a kernel library codename:

* a ``conv`` kernel (``conv_kn2row``, ``conv_kn2col``, ...): KH*KW accumulating GEMMs on the
  unreplicated input, whose extra memory is at most a padded output;
* an ``im2col`` kernel (``im2row``, ``im2col``): the KH*KW-times patch matrix, then the device's
  matmul (chosen for the product ``COUT x KH*KW*CG x batch*OH*OW`` like any Dense layer's). It runs
  only while the patch matrix fits the *patch budget* (:func:`patch_budget`), so a board short of
  memory never allocates it.

For a layer of geometry ``g`` (:class:`ConvGeometry`) the order is:

1. the choice made with :func:`malinn.choice.kernel_choice.use` for op ``"im2col"`` (one group), else
   for op ``"conv"``;
2. the tuning database's winner for ``g`` on this device (``malinn tune --model`` times each conv
   layer's candidates: :func:`malinn.tuning.tuner.tune_convs`);
3. the first of the library's ``conv_algorithms`` rules for the device's kind whose conditions
   hold for ``g`` (and, for an ``im2col`` kernel, whose patches fit the budget); the last rule,
   the general kernel, otherwise.

``conv_algorithms`` in kernels/library.json::

    "conv_algorithms": {"patch_budget_mib": {"gpu": 512, "*": 64},
                        "rules": {"gpu": [{"codename": "conv_kn2col", "when": {"max_cg": 31}},
                                          {"codename": "im2row"},
                                          {"codename": "conv_kn2row", "defines": {"LOCAL": 1, ...}}], ...}}

Conditions (``when``) are bounds on the geometry: ``min_``/``max_`` of ``cg`` (input channels per
group), ``cout``, ``taps`` (KH*KW), ``pixels`` (batch*OH*OW), ``image`` (OH*OW), ``stride``
(the larger of SH, SW), ``batch``.
"""

from __future__ import annotations

from typing import Any

from ..backends.base import Device
from ..errors import BackendError, LibraryError
from ..library.kernel_library import KernelSpec, load_library
from .conv_geometry import ConvGeometry
from .kernel_choice import choose, explicit_choice
from .tuning_db import tuned_conv

__all__ = [
    "ConvGeometry",
    "choose_algorithm",
    "default_algorithm",
    "holds",
    "runs",
    "patch_budget",
    "patch_bytes",
    "rules",
    "CONDITIONS",
    "ALGORITHM_OPS",
]

#: the ops whose kernels are a convolution algorithm
ALGORITHM_OPS = ("conv", "im2col")
#: what a rule's ``when`` may bound
CONDITIONS = ("cg", "cout", "taps", "pixels", "image", "stride", "batch")
#: the patch budget where the library names none for the device's kind (MiB)
DEFAULT_PATCH_BUDGET_MIB = 64


def patch_bytes(geometry: ConvGeometry, device: Device | None = None) -> int:
    """Bytes of the patch matrix an im2col algorithm builds (float32): padded as the matmul that
    ``device`` would run on it pads its right operand (rows of 9 taps padded to 64 are 7 times the
    unpadded size), unpadded without a device."""
    m, k, n = geometry.product()
    if device is None:
        return 4 * k * n
    rows, cols = choose("matmul", device, (m, k, n)).padded_shapes(m, k, n)["b"]
    return 4 * max(rows * cols, k * n)


def _section() -> dict:
    """The library's ``conv_algorithms`` section (read with the library's file)."""
    return load_library().section("conv_algorithms")


def _for_kind(table: dict, device: Device) -> Any:
    keys = (f"{device.backend}:{device.kind}", device.backend, device.kind, "*")
    return next((table[k] for k in keys if k in table), None)


def patch_budget(device: Device) -> int:
    """The most bytes an im2col algorithm's patch matrix may take on ``device``: the library's
    ``patch_budget_mib`` for the device's kind, and never more than a quarter of the device's
    largest allocation."""
    mib = _for_kind(_section().get("patch_budget_mib", {}), device)
    mib = DEFAULT_PATCH_BUDGET_MIB if mib is None else mib
    return min(int(mib) * 2**20, device.max_allocation // 4)


def rules(device: Device) -> list:
    """The device kind's rules: ``[(spec, when), ...]``, each spec configured as the rule says.

    Raises:
        LibraryError: a rule names no convolution kernel, a bad define or an unknown condition.
    """
    library = load_library()
    found = []
    for i, rule in enumerate(_for_kind(_section().get("rules", {}), device) or []):
        field = f"{library.path}: field 'conv_algorithms.rules' ({device.kind}, rule {i})"
        codename = rule.get("codename") if isinstance(rule, dict) else None
        if not isinstance(codename, str) or codename not in library or library[codename].op not in ALGORITHM_OPS:
            raise LibraryError(f"{field}: {codename!r} is not a conv or im2col kernel")
        when = rule.get("when", {})
        bad = [k for k in when if k[4:] not in CONDITIONS or k[:4] not in ("min_", "max_")]
        if bad:
            raise LibraryError(f"{field}: unknown conditions {bad}; expected min_/max_ of {', '.join(CONDITIONS)}")
        spec = library[codename]
        if not spec.has_source(device.backend):
            continue
        found.append((spec.configure(rule.get("defines")), dict(when)))
    return found


def holds(when: dict, geometry: ConvGeometry) -> bool:
    """Whether ``geometry`` meets a rule's conditions."""
    measures = geometry.measures()
    return all(measures[k[4:]] >= v if k.startswith("min_") else measures[k[4:]] <= v for k, v in when.items())


def runs(spec: KernelSpec, geometry: ConvGeometry, device: Device) -> bool:
    """Whether ``spec`` can run ``geometry`` on ``device``: an im2col kernel needs one group and
    patches within :func:`patch_budget`; a conv kernel's preconditions must hold for the product
    ``(COUT, KH*KW*CG, batch*OH*OW)``, the device must launch its work-group and local memory
    (:meth:`~malinn.library.kernel_library.KernelSpec.fits`), and on a device that ends long loops early
    (llvmpipe) its loops must fit (:meth:`~malinn.library.kernel_library.KernelSpec.loops_fit`)."""
    if spec.op == "im2col":
        return geometry.groups == 1 and patch_bytes(geometry, device) <= patch_budget(device)
    if spec.op != "conv" or not spec.accepts(*geometry.product()):
        return False
    configured = spec.configure(geometry.defines())
    return configured.fits(device) and configured.loops_fit(device, {})


def choose_algorithm(device: Device, geometry: ConvGeometry) -> tuple[KernelSpec, str]:
    """The algorithm of one convolution layer (see the module docstring for the order).

    Returns:
        ``(spec, why)``: the kernel (op ``conv`` or ``im2col``, configured, without the layer's
        geometry) and ``"explicit"``, ``"tuned"`` or ``"default"``.
    """
    library = load_library()
    for op in ("im2col", "conv"):
        chosen = explicit_choice(op, device)
        if chosen is not None and (op == "conv" or geometry.groups == 1):
            return library[chosen[0]].configure(chosen[1]), "explicit"
    tuned = tuned_conv(device, geometry)
    if tuned is not None:
        spec = library[tuned[0]].configure(tuned[1])
        if runs(spec, geometry, device):
            return spec, "tuned"
    return default_algorithm(device, geometry), "default"


def _launches(spec: KernelSpec, geometry: ConvGeometry, device: Device) -> bool:
    """Whether ``device`` can launch ``spec`` configured for ``geometry`` (its work-group and local
    memory), whether or not it can run the layer."""
    try:
        return spec.configure(geometry.defines()).fits(device)
    except LibraryError:
        return False


def default_algorithm(device: Device, geometry: ConvGeometry) -> KernelSpec:
    """The untuned choice: the first of the library's ``conv_algorithms`` rules for the device's
    kind whose conditions hold for ``geometry`` and whose kernel can run it (:func:`runs`); else the
    last conv rule (the general kernel), the library's ``conv`` defaults for the kind and the other
    conv rules, each in the first of its configurations the device can run it in (a board whose
    work-groups or local memory are smaller than a rule's configuration needs); else the first of
    those the device can launch, whose binding then says why it cannot run the layer (llvmpipe's
    loop limit, say).

    Raises:
        BackendError: no configuration of those kernels runs ``geometry`` on ``device``; the message
            names the geometry and the device's work-group and local-memory limits.
    """
    found = [(spec, when) for spec, when in rules(device) if spec.op == "conv" or geometry.groups == 1]
    for spec, when in found:
        if holds(when, geometry) and runs(spec, geometry, device):
            return spec
    general = [spec for spec, _ in found if spec.op == "conv"][::-1]
    general += load_library().default_specs("conv", device.kind, device.backend)
    launchable = None  # the first configuration the device launches, whatever else keeps it from running
    for spec in general:
        for config in [spec.config] + spec.configurations(device):
            candidate = spec.configure(config)
            if runs(candidate, geometry, device):
                return candidate
            if launchable is None and _launches(candidate, geometry, device):
                launchable = candidate
    if launchable is not None:  # its launch names why it cannot run (llvmpipe's loop limit, say)
        return launchable
    raise BackendError(
        f"no convolution kernel of the library runs {geometry.key()} on {device.name} "
        f"(work-groups of at most {device.max_work_group_size} items, "
        f"{device.local_memory:,} bytes of local memory)"
    )
