#!/usr/bin/env bash
# README's walk as a newcomer does it: a fresh clone, then every command of README's ```sh blocks
# in order, as written (the test-suite line skipped, the built-in provider run in the background,
# nfview stopped after 10 s), each with its status and seconds.
#   tools/readme_walk.sh PYTHON DIR     e.g. tools/readme_walk.sh python3.13 /tmp/walk313
set -u
PY=$(command -v "$1"); DIR=$2; REPO=$(cd "$(dirname "$0")/.." && pwd)
rm -rf "$DIR" && git clone -q "$REPO" "$DIR" && cd "$DIR" || exit 1
mkdir -p .bin && ln -s "$PY" .bin/python3 && export PATH=$DIR/.bin:$PATH  # README says python3
awk '/^```sh$/ {inside = 1; next} /^```$/ {inside = 0} inside' README.md | sed 's/  *# .*$//' > walk-commands.txt
export OPENAI_API_KEY=sk-local  # README: any key does for the built-in provider
provider=""
while IFS= read -r cmd; do
  case "$cmd" in
    *pytest*) echo "(skipped: the test suite) $cmd";;
    *"nfladder provider"*) bash -c "$cmd" < /dev/null > provider.log 2>&1 & provider=$!; sleep 4; cat provider.log;;
    *nfview*) timeout 10 bash -c "$cmd" < /dev/null; echo "= nfview: $? (124: it was serving when stopped)";;
    *) echo "+ $cmd"; start=$SECONDS; bash -c "$cmd" < /dev/null; echo "= exit $?, $((SECONDS - start)) s";;
  esac
done < walk-commands.txt
[ -n "$provider" ] && kill "$provider"
