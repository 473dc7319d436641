#!/usr/bin/env bash
# Which module library may link which, through any chain of links: the CMake link graph as the
# configure step wrote it (arlo_write_link_graph, cmake/ArloTargets.cmake), checked against the
# rules below. Includes are checked by module_includes.sh; this catches what includes cannot see,
# a library that links a higher module without including its headers. Libraries without a rule may
# link anything below session/; third-party libraries are not checked.
# Test support (arlo_testing, testing/) is linked by tests and benches only: no library but the
# test libraries below reaches it.
# Usage: module_links.sh BUILD_DIR
set -euo pipefail
graph=${1:?usage: module_links.sh BUILD_DIR}/layering/links.txt
[[ -f $graph ]] || { echo "no link graph at $graph (configure the build first)" >&2; exit 1; }

# library              may reach (besides itself)
rules=(
  "arlo_common         arlo_third_party"
  "arlo_web            arlo_third_party"
  # The loop: its ports, options and status page come from session/.
  "arlo_orchestrator   arlo_common arlo_third_party"
  "arlo_weight_sync    arlo_common arlo_third_party"
  "arlo_rollout        arlo_common arlo_third_party"
  "arlo_trainer_bridge arlo_common arlo_third_party arlo_weight_sync"
  "arlo_config         arlo_common arlo_third_party arlo_weight_sync arlo_rollout"
)

# Libraries of tests and benches: they may link arlo_testing.
test_libraries=" arlo_testing "

declare -A links
while IFS= read -r line; do
  links[${line%%:*}]=${line#*:}
done <"$graph"

# Every arlo library `lib` reaches through its links (depth first, each once).
reach() {
  local -A seen=()
  local stack=("$1") lib dep
  while ((${#stack[@]})); do
    lib=${stack[-1]}
    unset 'stack[-1]'
    for dep in ${links[$lib]-}; do
      [[ $dep == arlo_* && -z ${seen[$dep]-} ]] || continue
      seen[$dep]=1
      stack+=("$dep")
    done
  done
  echo "${!seen[@]}"
}

problems=""
for rule in "${rules[@]}"; do
  read -r lib allowed <<<"$rule"
  [[ -n ${links[$lib]+x} ]] || { problems+="$lib: not in the link graph (renamed? update the rules in $0)"$'\n'; continue; }
  for dep in $(reach "$lib"); do
    [[ $dep == "$lib" || " $allowed " == *" $dep "* ]] || problems+="$lib links $dep (it may reach only: $allowed)"$'\n'
  done
done
for lib in "${!links[@]}"; do
  [[ $lib == arlo_session* ]] && continue
  for dep in $(reach "$lib"); do
    [[ $dep == arlo_session* ]] && problems+="$lib links $dep (only apps and tests may link session/)"$'\n'
  done
done

for lib in "${!links[@]}"; do
  [[ $test_libraries == *" $lib "* ]] && continue
  for dep in $(reach "$lib"); do
    [[ $dep == arlo_testing ]] && problems+="$lib links $dep (only tests and benches may link testing/)"$'\n'
  done
done

if [[ -n $problems ]]; then
  echo "links across the module layering (see the rules in $0):" >&2
  printf '%s' "$problems" | sort >&2
  exit 1
fi
echo "ok: ${#links[@]} libraries; ${#rules[@]} with rules reach only what they may"
