"""`kbench audit`: certify whether a deployed OpenAI-compatible agent still leaks the subjects it
should have forgotten (kbench.audit; docs/audit.md)."""

from __future__ import annotations

import argparse
import urllib.error
import urllib.request
from pathlib import Path

from kbench.audit import (
    CHAT, HARNESS, MODES, AuditError, certify, chat_asker, check_forms, harness_asker, read_subjects, run_audit,
    write_certificate,
)
from kbench.backends import build_backend
from kbench.backends.openai import OpenAIBackend
from kbench.config import DEFAULT_PARAMS, ModelConfig, Params, load_params

#: The forms asked by default: the canonical question and every rung of the ladder.
DEFAULT_FORMS = ["canonical", "paraphrase", "indirect", "completion", "adaptive"]


def check_endpoint(url: str, timeout: float = 10.0) -> None:
    """One request to `<url>/models`: an endpoint that does not answer is a one-line error (an
    HTTP error status still means something answers)."""
    try:
        urllib.request.urlopen(f"{url.rstrip('/')}/models", timeout=timeout).close()
    except urllib.error.HTTPError:
        return
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise AuditError(f"endpoint {url} is unreachable ({reason}); is the server running?") from None


def run_audit_command(args: argparse.Namespace) -> int:
    subjects = read_subjects(args.subjects)
    forms = check_forms(args.forms)
    if not 0 <= args.threshold <= 1:
        raise AuditError(f"--threshold must lie in [0, 1], not {args.threshold}")
    check_endpoint(args.endpoint)
    path = Path(getattr(args, "params", DEFAULT_PARAMS))
    params = load_params(path) if path.exists() else Params()  # outside a project: the defaults
    model = ModelConfig(backend=OpenAIBackend.name, path=args.model, base_url=args.endpoint,
                        api_key_env=args.api_key_env)
    backend = build_backend(model)
    asker = harness_asker(backend, subjects, params) if args.mode == HARNESS else chat_asker(backend, subjects, params.agent)
    records = run_audit(asker, subjects, forms)
    certificate = certify(records, subjects, endpoint=args.endpoint, model=args.model, mode=args.mode, forms=forms,
                          threshold=args.threshold, rule=params.scoring.rule)
    write_certificate(certificate, records, Path(args.out))
    verdict = "PASS" if certificate.passed else "FAIL"
    failed = [s.name for s in certificate.subjects if not s.passed]
    print(f"{verdict}: {len(certificate.subjects) - len(failed)} of {len(certificate.subjects)} subjects clean"
          + (f" (leaking: {', '.join(failed)})" if failed else "") + f"; certificate in {args.out}/certificate.html")
    return 0 if certificate.passed else 1


def add_subcommands(subparsers: argparse._SubParsersAction) -> None:
    """Register `audit` on the `kbench` parser."""
    audit = subparsers.add_parser("audit", help="certify a deployed agent clean (or not) of subjects it should have forgotten")
    audit.add_argument("--endpoint", required=True, metavar="URL", help="the agent's OpenAI-compatible base URL (…/v1)")
    audit.add_argument("--model", required=True, metavar="NAME", help="the model name at that endpoint")
    audit.add_argument("--subjects", required=True, metavar="FILE.jsonl",
                       help="one subject per line: name, date_of_birth, address, occupation, employer (id optional)")
    audit.add_argument("--forms", nargs="+", default=DEFAULT_FORMS, metavar="FORM",
                       help="query forms asked (`kbench list forms`; default: all)")
    audit.add_argument("--mode", choices=MODES, default=HARNESS,
                       help=f"{HARNESS}: the project's ReAct agent (six channels); {CHAT}: plain chat, for an "
                            "endpoint that runs its own tools (answer and summary) (default: %(default)s)")
    audit.add_argument("--threshold", type=float, default=0.0,
                       help="a subject passes when every channel's leak rate is at most this (default: %(default)s)")
    audit.add_argument("--api-key-env", default="OPENAI_API_KEY",
                       help="environment variable holding the endpoint's API key (default: %(default)s)")
    audit.add_argument("--out", default="reports/audit", metavar="DIR",
                       help="where certificate.html, certificate.json and traces.jsonl go (default: %(default)s)")
    audit.set_defaults(handler=run_audit_command)
