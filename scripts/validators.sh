#!/usr/bin/env bash
# scripts/validators.sh: the validators tests/deploy.rs runs on the deployment files, offline,
# installed from PyPI into a virtualenv of this checkout (.validators/, git-ignored) at the
# versions of scripts/validators.txt:
#   - kubernetes-validate: every manifest of deploy/k8s against the Kubernetes API's schemas;
#   - check-jsonschema: docker-compose.yml against the compose specification's schema.
# scripts/test.sh runs it (after scripts/prereqs.sh, which installs python3's venv module when
# missing). It downloads only when .validators/ is missing or was made from another
# scripts/validators.txt (a stamp holds that file's hash); otherwise it does nothing.
set -euo pipefail
ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
VENV=$ROOT/.validators
REQUIREMENTS=$ROOT/scripts/validators.txt

want=$(sha256sum "$REQUIREMENTS" | cut -d' ' -f1)
if [ "$(cat "$VENV/.stamp" 2>/dev/null)" = "$want" ] \
  && [ -x "$VENV/bin/kubernetes-validate" ] && [ -x "$VENV/bin/check-jsonschema" ]; then
  exit 0
fi
command -v python3 >/dev/null || { echo "validators.sh: python3 not found (scripts/prereqs.sh installs it)" >&2; exit 1; }
rm -rf "$VENV"
python3 -m venv "$VENV" \
  || { echo "validators.sh: python3 -m venv failed: install python3's venv module (Debian: python3-venv)" >&2; exit 1; }
# A failure here ends the script without a stamp: the next run tries again, and the tests that
# need the validators fail naming this script.
"$VENV/bin/pip" install --quiet --disable-pip-version-check --no-input -r "$REQUIREMENTS"
"$VENV/bin/kubernetes-validate" --version >/dev/null
"$VENV/bin/check-jsonschema" --version >/dev/null
echo "$want" >"$VENV/.stamp"
echo "validators.sh: kubernetes-validate and check-jsonschema installed in .validators/" >&2
