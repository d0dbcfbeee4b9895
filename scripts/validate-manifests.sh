#!/usr/bin/env bash
# Validates every manifest in deploy/ offline against the Kubernetes API schema (strict:
# an unknown or misspelt field fails), and checks kustomization.yaml lists each of them.
set -euo pipefail
cd "$(dirname "$0")/.."
manifests=()
for f in deploy/*.yaml; do
  [ "$f" = deploy/kustomization.yaml ] && continue
  manifests+=("$f")
  grep -qx "  - $(basename "$f")" deploy/kustomization.yaml \
    || { echo "deploy/kustomization.yaml does not list $(basename "$f")" >&2; exit 1; }
done
.venv/bin/kubernetes-validate --strict --quiet "${manifests[@]}"
echo "${#manifests[@]} manifests valid"
