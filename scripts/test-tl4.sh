#!/usr/bin/env bash
# The second environment's part of `make test`: in .venv-tl4 (TransformerLens 4.3, TransformerBridge
# only) the tests marked tl4, then every analysis sub-command on two tiny models. Fails when either
# fails, and when no test is marked tl4 (pytest's exit 5): a run that tested nothing is no pass.
set -euo pipefail
cd "$(dirname "$0")/.."
py=.venv-tl4/bin/python
version=$("$py" -c "import importlib.metadata as m; print(m.version('transformer_lens'))")
case "$version" in
  4.*) ;;
  *) echo "test-tl4: .venv-tl4 has transformer_lens $version, not 4.x; rerun scripts/setup.sh --tl4" >&2; exit 1 ;;
esac
start=$(date +%s)
rc=0
"$py" -m pytest -m tl4 -n 2 --dist loadfile "$@" || rc=$?
if [ "$rc" = 5 ]; then
  echo "test-tl4: no test is marked tl4 (pytest collected none): nothing was tested on TransformerLens $version" >&2
  exit 1
fi
[ "$rc" = 0 ] || exit "$rc"
echo "test-tl4: tests marked tl4 passed on TransformerLens $version in $(( $(date +%s) - start )) s"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
start=$(date +%s)
# Every analysis sub-command end to end (tables, claims, report, browser check) on a tiny Llama and a
# tiny Gemma-3 (window layers), through the bridge, while the quick reproduction on the default models
# runs beside them (one core each). A cache of its own: weights converted under TransformerLens 3.9 in
# ~/.cache are not reused.
sub_commands() {
  for command in decompose bos sinks probe fingerprint; do
    for model in tiny-llama tiny-gemma3; do
      LENS_POSITION_CACHE="$out/cache" OMP_NUM_THREADS=1 .venv-tl4/bin/lens-position "$command" "$model" --quick \
        --no-progress --out "$out/$command-$model" > "$out/$command-$model.log" 2>&1 ||
        { cat "$out/$command-$model.log" >&2; echo "test-tl4: $command on $model failed" >&2; return 1; }
      test -s "$out/$command-$model/claims.csv" ||
        { echo "test-tl4: $command on $model wrote no claims.csv" >&2; return 1; }
    done
  done
}
sub_commands &
sub_pid=$!
# The quick reproduction on the embedded default models (SmolLM2-135M, Gemma-3-270M), every step,
# through the bridge: what a researcher with TransformerLens 4.x runs first.
LENS_POSITION_CACHE="$out/cache" .venv-tl4/bin/lens-position reproduce --quick --no-progress --out "$out/reproduce"
wait "$sub_pid" || { echo "test-tl4: the analysis sub-commands failed on TransformerLens $version" >&2; exit 1; }
echo "test-tl4: the analysis sub-commands passed on TransformerLens $version"
for file in claims.csv report.html; do
  test -s "$out/reproduce/$file" || { echo "test-tl4: reproduce --quick wrote no $file" >&2; exit 1; }
done
grep -q '"transformer_lens": "4\.' "$out/reproduce/provenance.json" ||
  { echo "test-tl4: the reproduction's provenance does not name TransformerLens 4.x" >&2; exit 1; }
echo "test-tl4: reproduce --quick passed on TransformerLens $version in $(( $(date +%s) - start )) s"
# A model split in two as it is read (half its modules on the host, half on disk), which only the bridge
# of TransformerLens 4.x takes: the benchmark checks it loads and computes, and prints its host memory.
LENS_POSITION_CACHE="$out/cache" "$py" benchmarks/split_load.py --tokens 32 | tee "$out/split.log"
grep -q "host memory over the whole model.s weights" "$out/split.log" || { echo "test-tl4: benchmarks/split_load.py failed" >&2; exit 1; }
