# Sourced by scripts/vllm_history.sh and scripts/sglang_history.sh: runs a target's
# recorded cases against released versions of its engine.
#
# A case is one line: `VERSION CONFIG EXPECTED [EXAMPLES [FLAGS...]]`, EXPECTED one of
# found, clean, any. It runs `kvpocket fuzz --target $target --config CONFIG --examples
# EXAMPLES --seed 0 FLAGS` with VERSION's wheel (installed without its dependencies into
# $root/VERSION, once) on top of the pinned environment's interpreter $py; a case with
# `--replay FILE` replays a recorded trace instead. Reproducers go to
# kvpocket-out/$target-history/VERSION. Before sourcing, the caller sets: target, package
# (the pip name), py, root, pinned, examples (the default count), and `cases` (an array);
# arguments `VERSION CONFIG ...` replace the cases with those pairs, reported only
# ($KVPOCKET_HISTORY_FLAGS: fuzz flags for them). `case_env VERSION` may print
# NAME=VALUE words the case runs with. Exit 0 when every case comes out as recorded.

history_pip() { "$py" -m pip -q --disable-pip-version-check "$@"; }

run_history_cases() {
  if [ $# -gt 0 ]; then
    cases=()
    while [ $# -ge 2 ]; do
      cases+=("$1 $2 any $examples ${KVPOCKET_HISTORY_FLAGS:-}"); shift 2
    done
  fi
  local status=0 summary=() case v config expected n flags path rc got
  for case in "${cases[@]}"; do
    read -r v config expected n flags <<<"$case"
    path=""
    if [ "$v" != "$pinned" ]; then
      [ -f "$root/$v/.done" ] || { history_pip install --no-deps --target "$root/$v" \
                                     "$package==$v" && touch "$root/$v/.done"; }
      path="$root/$v:"
    fi
    echo "== $package $v, $config, ${n:-$examples} examples${flags:+ $flags} (expected: $expected)"
    rc=0
    # shellcheck disable=SC2046,SC2086  # case_env's words and the flags split on purpose
    env $(case_env "$v") PYTHONPATH="$path$root/extra:$PWD/.devpath" "$py" -m kvpocket.verify.cli \
      fuzz --target "$target" --config "$config" --examples "${n:-$examples}" --seed 0 \
      ${flags:-} --out "kvpocket-out/$target-history/$v" || rc=$?
    got=clean; [ $rc = 1 ] && got=found; [ $rc -gt 1 ] && got="error ($rc)"
    summary+=("$v $config${flags:+ ($flags)}: $got (expected $expected)")
    if [ "$expected" != any ] && [ "$got" != "$expected" ]; then status=1; fi
  done
  printf '%s\n' "${summary[@]}"
  return $status
}
