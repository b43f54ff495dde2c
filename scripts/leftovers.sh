#!/usr/bin/env bash
# A test run leaves nothing outside its own tree and temporary directories: this lists what
# is in the home directory (all of it, less the repository when it lies there) and at the top
# of the temporary directory, before the tests, and after them says what appeared.
#   scripts/leftovers.sh snapshot FILE   writes the list to FILE
#   scripts/leftovers.sh check FILE      exits 1, naming each new path, if anything appeared
# .ci/run takes the snapshot before the README's test command and checks after its last stage.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd -P)
tmp=$(cd "${TMPDIR:-/tmp}" && pwd -P)

list() {
  {
    [[ -d "$HOME" ]] && find "$(cd "$HOME" && pwd -P)" -xdev \( -path "$repo" -o -path "$tmp" \) -prune \
      -o -print 2>/dev/null
    find "$tmp" -mindepth 1 -maxdepth 1 \( -path "$repo" \) -prune -o -print 2>/dev/null
  } | LC_ALL=C sort -u -S 1G
}

case "${1:-}" in
  snapshot) list >"$2" ;;
  check)
    new=$(LC_ALL=C comm -13 "$2" <(list))
    if [[ -n "$new" ]]; then
      echo "left outside the tests' own directories by the test run ($(wc -l <<<"$new") paths):"
      head -n 50 <<<"$new" | sed 's/^/  /'
      exit 1
    fi
    echo "nothing left in $HOME or $tmp by the test run"
    ;;
  *) echo "usage: scripts/leftovers.sh snapshot|check FILE" >&2; exit 2 ;;
esac
