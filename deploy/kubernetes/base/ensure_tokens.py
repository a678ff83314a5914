"""Create the Secret `inferd-tokens` (webhook-token, admin-token) unless it exists.

Runs once per `kubectl apply -k` as the Job `inferd-tokens`, in the inferd image, with
the standard library only: it talks to the API server with the pod's service-account
token. An existing Secret is never changed, so re-applying keeps the tokens (rotate by
deleting the Secret and re-applying). Tokens are random, so none is ever committed.

    python ensure_tokens.py [--api URL] [--namespace NS] [--name NAME]
"""

from __future__ import annotations

import argparse
import base64
import json
import secrets
import ssl
import sys
import urllib.error
import urllib.request
from pathlib import Path

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
KEYS = ("webhook-token", "admin-token")


def secret_body(name: str, namespace: str, labels: dict[str, str]) -> dict:
    data = {key: base64.b64encode(secrets.token_hex(32).encode()).decode() for key in KEYS}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "type": "Opaque",
        "data": data,
    }


def ensure_secret(
    api: str, namespace: str, name: str, token: str, context: ssl.SSLContext | None, labels: dict[str, str]
) -> str:
    """'exists' or 'created'; raises urllib.error.HTTPError on anything else."""
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
    base = f"{api.rstrip('/')}/api/v1/namespaces/{namespace}/secrets"
    try:
        urllib.request.urlopen(urllib.request.Request(f"{base}/{name}", headers=headers), context=context, timeout=10)
        return "exists"
    except urllib.error.HTTPError as exc:
        if exc.code != 404:
            raise
    body = json.dumps(secret_body(name, namespace, labels)).encode()
    request = urllib.request.Request(
        base, data=body, method="POST", headers={**headers, "Content-Type": "application/json"}
    )
    try:
        urllib.request.urlopen(request, context=context, timeout=10)
    except urllib.error.HTTPError as exc:
        if exc.code == 409:  # another run created it meanwhile: keep that one
            return "exists"
        raise
    return "created"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--api", default="https://kubernetes.default.svc", help="API server URL")
    parser.add_argument("--namespace", help="default: the pod's own namespace")
    parser.add_argument("--name", default="inferd-tokens")
    parser.add_argument("--service-account-dir", type=Path, default=SERVICE_ACCOUNT)
    parser.add_argument("--label", action="append", default=[], metavar="KEY=VALUE", help="label for a new Secret")
    args = parser.parse_args(argv)
    account = args.service_account_dir
    namespace = args.namespace or (account / "namespace").read_text().strip()
    token = (account / "token").read_text().strip()
    ca = account / "ca.crt"
    context = ssl.create_default_context(cafile=str(ca)) if args.api.startswith("https") and ca.is_file() else None
    labels = dict(item.split("=", 1) for item in args.label)
    try:
        outcome = ensure_secret(args.api, namespace, args.name, token, context, labels)
    except urllib.error.HTTPError as exc:
        print(f"secret {namespace}/{args.name}: API server answered {exc.code}: {exc.read()[:500]!r}", file=sys.stderr)
        return 1
    except urllib.error.URLError as exc:
        print(f"secret {namespace}/{args.name}: cannot reach {args.api}: {exc.reason}", file=sys.stderr)
        return 1
    print(f"secret {namespace}/{args.name} {outcome}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
