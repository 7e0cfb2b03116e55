#!/usr/bin/env bash
# check-files.sh fails when a committed file is an executable (ELF, Mach-O,
# PE) or larger than 1 MiB, unless it is a fixture under a testdata/
# directory: build outputs belong in .gitignore, not in the repository.
set -euo pipefail
cd "$(dirname "$0")/.."

limit=$((1024 * 1024))
bad=0
while IFS= read -r -d '' f; do
  [ -f "$f" ] || continue
  case "$f" in */testdata/*|testdata/*) continue ;; esac
  size=$(stat -c %s "$f")
  magic=$(head -c 4 "$f" | od -An -tx1 | tr -d ' \n')
  case "$magic" in
    7f454c46|cffaedfe|cefaedfe|feedface|feedfacf|4d5a*) echo "check-files: $f is an executable; add it to .gitignore and remove it with git rm --cached"; bad=1 ;;
  esac
  if [ "$size" -gt "$limit" ]; then
    echo "check-files: $f is $size bytes, over 1 MiB; only fixtures under testdata/ may be that large"
    bad=1
  fi
done < <(git ls-files -z)
exit $bad
