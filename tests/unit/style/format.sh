#!/usr/bin/env bash
# The C++ sources follow .clang-format (checked with clang-format 14, the version scripts/bootstrap
# installs: another version may wrap some lines differently). `make format` rewrites them in place.
# Usage: format.sh SOURCE_DIR
set -euo pipefail
src=${1:?usage: format.sh SOURCE_DIR}
cf=$(command -v clang-format-14 || true)
[[ -n $cf ]] || { echo "clang-format-14 is missing (scripts/bootstrap installs it)" >&2; exit 1; }
cd "$src"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files '*.cc' '*.h' | grep -v '^tests/fuzz/corpus/')
else
  mapfile -t files < <(find apps bench common orchestrator reference rollout session tests trainer_bridge weight_sync web \
                         -name '*.cc' -o -name '*.h' 2>/dev/null | grep -v '^tests/fuzz/corpus/')
fi
bad=()
for f in "${files[@]}"; do
  [[ -f $f ]] || continue
  "$cf" --style=file --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if ((${#bad[@]})); then
  echo "${#bad[@]} file(s) do not follow .clang-format (run: make format):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  exit 1
fi
echo "ok: ${#files[@]} C++ files follow .clang-format"
