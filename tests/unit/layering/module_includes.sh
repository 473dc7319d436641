#!/usr/bin/env bash
# Which module may include which: each rule below names a folder and the folders of the project its
# sources may include (`#include "<folder>/..."`, from the repo root). The library modules never
# include session/ or apps/; session/ (arlo run as a library) composes the modules below it; the
# arlo command line (apps/arlo) reaches the run only through session/. A rule's folder does not
# cover a subfolder that has a rule of its own.
# Usage: module_includes.sh SOURCE_DIR
set -euo pipefail
src=${1:?usage: module_includes.sh SOURCE_DIR}
cd "$src"

# folder                 may include
rules=(
  "common                common"
  # The schema asks the registries for their keys and kinds: weight_sync's transports and rollout's
  # admin dialects, environments and reward modules.
  "config                common weight_sync rollout config"
  "weight_sync           common weight_sync"
  "rollout               common rollout arlo"  # arlo/: the public reward plugin header (include/arlo)
  "trainer_bridge        common weight_sync trainer_bridge"
  "reference             common weight_sync reference"
  "web                   common web"
  "orchestrator          common orchestrator"  # the loop and its ports; session/ has their adapters
  "session               common config web weight_sync rollout trainer_bridge reference orchestrator session"
  "apps/arlo             common config web session apps/arlo"
  # Test support (tests and benches include it; no rule above lists it, so no module may).
  "testing               common config web weight_sync rollout trainer_bridge reference orchestrator session testing"
  # Benches use the modules and the test support, never a test's own files (tests/).
  "bench                 common config web weight_sync rollout trainer_bridge reference orchestrator session testing bench"
)
project='(common|config|weight_sync|rollout|trainer_bridge|reference|web|orchestrator|session|apps|bench|examples|tests|testing|arlo)/'

folders=()
for rule in "${rules[@]}"; do folders+=("${rule%% *}"); done

problems=""
checked=0
for rule in "${rules[@]}"; do
  read -r folder allowed <<<"$rule"
  [[ -d $folder ]] || continue
  prune=()
  for other in "${folders[@]}"; do
    [[ $other == "$folder"/* ]] && prune+=(-path "$other" -prune -o)
  done
  allowed_re="^($(echo "$allowed" | tr ' ' '|'))/"
  while IFS= read -r file; do
    checked=$((checked + 1))
    while IFS=: read -r line include; do
      target=${include#*\"}
      target=${target%%\"*}
      [[ $target =~ ^$project ]] || continue
      if [[ ! $target =~ $allowed_re ]]; then
        problems+="$file:$line: includes $target (${folder}/ may include: ${allowed})"$'\n'
      fi
    done < <(grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$file" || true)
  done < <(find "$folder" "${prune[@]}" -type f \( -name '*.cc' -o -name '*.h' -o -name '*.inc' \) -print)
done

if [[ -n $problems ]]; then
  echo "includes across the module layering (a module includes only what it may; see the rules in $0):" >&2
  printf '%s' "$problems" >&2
  exit 1
fi
echo "ok: $checked files in ${#rules[@]} folders include only what their module may"
