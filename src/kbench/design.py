"""The design a params file defines, checked against the registries before any stage runs.

`kbench.config` checks the schema (keys, types, ranges); this module checks what only the
registries know: that `model.backend`, every entry of `substrates`, every entry of `methods`
and `scoring.rule` name a registered backend, substrate, method and scoring rule. An unknown
name fails at start-up naming the key and the registered names.
"""

from __future__ import annotations

from pathlib import Path

from kbench.backends import backend_names
from kbench.config import DEFAULT_PARAMS, Params, ParamsError, load_params
from kbench.methods import method_names
from kbench.observer.matcher import scoring_rule_names
from kbench.substrates import substrate_names


def _check(names: list[str], registered: list[str], key: str, kind: str) -> None:
    unknown = [name for name in names if name not in registered]
    if unknown:
        raise ParamsError(f"key '{key}': unknown {kind}(s) {unknown}; registered: {registered}")


def check_design(params: Params, *, source: str = "params") -> Params:
    """`params` if every registered name it uses is registered; else ParamsError naming the key."""
    try:
        _check([params.model.backend], backend_names(), "model.backend", "backend")
        _check(params.substrates, substrate_names(), "substrates", "substrate")
        _check(params.methods, method_names(), "methods", "method")
        _check([params.scoring.rule], scoring_rule_names(), "scoring.rule", "scoring rule")
    except ParamsError as exc:
        raise ParamsError(f"{source}: {exc}") from None
    return params


def load_design(path: str | Path = DEFAULT_PARAMS) -> Params:
    """A params file read, validated against the schema and checked against the registries."""
    return check_design(load_params(path), source=str(path))
