"""A kernel library entry checked whole: its variant resolved, its field names, its defines against
its sources, and (in depth) every configuration its candidates give."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import LibraryError
from .expressions import evaluate
from .kernel_sources import source_identifiers
from .kernel_spec import KernelSpec, build_spec
from .matrix_restriction import MATRIX_NAMES
from .precision_table import DEFAULT_PRECISION, WEIGHTS_HEADER

__all__ = [
    "ENTRY_FIELDS",
    "RESTRICTION_FIELDS",
    "MATRIX_FIELDS",
    "SOURCE_FIELDS",
    "CHOICE_FIELDS",
    "unknown_fields",
    "with_base",
    "validate_entry",
]


def with_base(path: Path, codename: str, entry: Any, entries: dict, seen: tuple = ()) -> Any:
    """``entry`` with the fields of the entry it is a ``variant_of`` under its own, as a JSON Merge
    Patch (RFC 7386) would: objects (``defines``, ``restrictions``, each matrix's restriction,
    ``preconditions``) merged key by key, a null removing the base's field, anything else replaced.
    The base may itself be a variant (resolved first).
    A variant changes a define, a layout or a precondition of a kernel without repeating the rest."""
    if not isinstance(entry, dict) or "variant_of" not in entry:
        return entry
    base = entries.get(entry["variant_of"])
    if not isinstance(base, dict) or len(seen) > len(entries) or entry["variant_of"] in seen:
        raise LibraryError(
            f"{path}: kernel {codename!r}, field 'variant_of': {entry['variant_of']!r} is not "
            f"an entry of the library (or its variants lead back to {codename!r})"
        )
    base = with_base(path, codename, base, entries, seen + (entry["variant_of"],))

    def merge(under, over):
        if not (isinstance(under, dict) and isinstance(over, dict)):
            return over
        merged = dict(under)
        for key, value in over.items():
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = merge(under.get(key), value)
        return merged

    return {key: value for key, value in merge(base, entry).items() if key != "variant_of"}


def validate_entry(
    path: Path, codename: str, entry: Any, precisions: dict, variant_of: str | None = None, deep: bool = True
) -> KernelSpec:
    """The spec of the library's entry ``codename`` (its variant already resolved: :func:`with_base`),
    its fields checked; in depth (``deep``) also every define against its sources and every
    configuration its candidates give."""
    if not isinstance(entry, dict):
        raise LibraryError(f"{path}: kernel {codename!r}, field '': expected an object")
    defines = entry.get("defines", {})
    if not isinstance(defines, dict):
        raise LibraryError(f"{path}: kernel {codename!r}, field 'defines': expected an object of NAME: simple value")
    _check_fields(path, codename, entry)
    spec = build_spec(path, codename, entry, dict(defines), precisions)
    if deep:
        _check_defines_used(path, codename, entry, defines)
    if spec.precisions != (DEFAULT_PRECISION,) and WEIGHTS_HEADER not in entry.get("includes", []):
        raise LibraryError(
            f"{path}: kernel {codename!r}, field 'precisions': lists "
            f"{', '.join(p for p in spec.precisions if p != DEFAULT_PRECISION)}, but the source does not "
            f"include {WEIGHTS_HEADER}, which reads the weights in them (docs/KERNELS.md)"
        )
    if not deep:
        return spec
    configs = spec.configurations()
    if len(configs) < 1 + len(spec.candidates):
        base = dict(spec.defines)
        seen: list[dict] = []
        for i, overrides in enumerate(({},) + spec.candidates):
            config = {**base, **{k: str(v) for k, v in overrides.items()}}
            broken = [c for c in spec.constraints if not evaluate(c, config)]
            what = "the defines" if i == 0 else f"candidate {i - 1} {overrides}"
            if broken or config in seen:
                inherited = (
                    f' (a variant inherits the candidates of {variant_of!r}: give it "candidates": null or its own)'
                    if i and variant_of
                    else ""
                )
                why = (
                    f"breaks {broken[0]!r}"
                    if broken
                    else "repeats " + ("the defines" if config == seen[0] else "another candidate")
                )
                raise LibraryError(f"{path}: kernel {codename!r}, field 'candidates': {what} {why}{inherited}")
            seen.append(config)
    for config in configs:  # every configuration the tuner can emit must resolve
        try:
            spec.configure(config)
        except LibraryError as exc:
            raise LibraryError(f"{path}: {exc}") from None
        if entry.get("local_bytes") is not None:
            try:
                evaluate(entry["local_bytes"], config)
            except (ValueError, TypeError) as exc:
                raise LibraryError(f"{path}: kernel {codename!r}, field 'local_bytes': {exc}") from None
    return spec


def _check_fields(path: Path, codename: str, entry: dict) -> None:
    """Refuses a field the entry, its restrictions, a matrix's restriction or another backend's
    source does not have (a misspelled ``precondition`` was ignored)."""

    def unknown(fields, known, where):
        found = unknown_fields(fields, known) if isinstance(fields, dict) else []
        if found:
            raise LibraryError(
                f"{path}: kernel {codename!r}, field {where + found[0]!r}: unknown field; expected one "
                f"of {', '.join(known)} (or a *_doc note)"
            )

    unknown(entry, ENTRY_FIELDS, "")
    restrictions = entry.get("restrictions")
    unknown(restrictions, RESTRICTION_FIELDS, "restrictions.")
    for name in MATRIX_NAMES:
        unknown(
            (restrictions or {}).get(name) if isinstance(restrictions, dict) else None,
            MATRIX_FIELDS,
            f"restrictions.{name}.",
        )
    for backend, value in (entry.get("sources") or {}).items() if isinstance(entry.get("sources"), dict) else ():
        unknown(value, SOURCE_FIELDS, f"sources.{backend}.")


#: the fields a kernel entry, its restrictions, a matrix's restriction, another backend's source
#: and a defaults choice may have (besides ``*_doc`` notes): a misspelled one is refused by name
ENTRY_FIELDS = (
    "op",
    "source",
    "function",
    "restrictions",
    "includes",
    "sources",
    "defines",
    "candidates",
    "constraints",
    "preconditions",
    "precisions",
    "epilogue",
    "activation",
    "aliases",
    "local_bytes",
    "scratch_bytes",
    "description",
    "variant_of",
)
RESTRICTION_FIELDS = (
    "a",
    "b",
    "r",
    "arglist",
    "buffers",
    "flop",
    "ndrange",
    "params",
    "scale",
    "split",
    "workgroup",
    "workgroup_bound",
    "workgroup_items",
    "argdefines",
)
MATRIX_FIELDS = ("representation", "rowAlign", "colAlign", "image", "logicalRows")
SOURCE_FIELDS = ("source", "includes", "loop_iterations")
CHOICE_FIELDS = ("codename", "defines", "precisions")


def unknown_fields(fields: dict, known: tuple) -> list:
    """The keys of ``fields`` that are neither in ``known`` nor a ``*_doc`` note."""
    return [k for k in fields if k not in known and not str(k).endswith("_doc")]


def _check_defines_used(path: Path, codename: str, entry: dict, defines: dict) -> None:
    """Refuses a define that none of the entry's sources mention (once per entry, after
    :func:`build_spec` checked the files exist): a misspelled one would be passed and ignored."""
    names = [entry["source"], *entry.get("includes", [])]
    for value in entry.get("sources", {}).values():
        value = {"source": value} if isinstance(value, str) else value
        names += [value["source"], *value.get("includes", [])]
    unused = [name for name in defines if not any(name in source_identifiers(path.parent / str(f)) for f in names)]
    if unused:
        raise LibraryError(
            f"{path}: kernel {codename!r}, field 'defines': {', '.join(map(repr, unused))} "
            f"{'appears' if len(unused) == 1 else 'appear'} in none of its sources "
            f"({', '.join(map(str, names))}): a misspelled define would be passed and ignored"
        )
